"""What a person should do about what a cleanup could not fix: one line per problem, printed in the summary.

recommend(plan, actions, skipped, states, respawners)
# ["GPU1: phantom memory: ...; restart the pod to reset the driver state: `podguard pod heal` ..."]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from podguard.preflight.cleanup.policy import Policy
from podguard.preflight.cleanup.process_table import scan_processes
from podguard.preflight.cleanup.vocabulary import (
    CleanupPlan,
    GpuIdleState,
    GpuState,
    KillRecord,
    Outcome,
    PlanConfig,
    Respawner,
    SkipCode,
    Skipped,
    Target,
)
from podguard.units import describe_memory

__all__ = ["HEAL_ADVICE", "gpus_text", "memory_text", "recommend", "starters_still_running", "unkillable_text"]

HEAL_ADVICE = (
    "restart the pod to reset the driver state: `podguard pod heal` (or stop + start the pod on RunPod; "
    "restarting only the container keeps the same driver state)"
)


def gpus_text(gpus: Sequence[int]) -> str:
    return ",".join(f"GPU{g}" for g in gpus) or "-"


def memory_text(t: Target) -> str:
    known = [m for m in t.memory.values() if m is not None]
    if not t.gpus:
        return "no GPU memory of its own"
    return describe_memory(sum(known)) if known else "memory not listed by NVML"


def unkillable_text(state: str | None) -> str:
    """Why a process survived SIGKILL (its /proc state) and what to do about it."""
    if state == "D":
        return "stuck in uninterruptible sleep (D state) after SIGKILL, usually inside the GPU driver; " + HEAL_ADVICE
    return f"still present after SIGKILL (state {state or '?'}); " + HEAL_ADVICE


_SKIP_ADVICE = {
    SkipCode.PROTECTED: "{gpus} held by protected pid {pid} ({cmd}): stop it yourself, or exclude that GPU with "
    "GPU_LIST",
    SkipCode.PID1: "{gpus} held by the container's PID 1: restart the container",
    SkipCode.ANCESTOR: "{gpus} held by pid {pid}, which started podguard: release the GPU there first",
    SkipCode.OTHER_USER: "{gpus} held by pid {pid} of another user: run podguard as root",
    SkipCode.LEASED: "{gpus} held by pid {pid} ({cmd}) of another live podguard run: wait for it, or choose other "
    "GPUs with GPU_LIST",
    SkipCode.RESPAWN_LIMIT: "pid {pid} keeps coming back: its launcher is not recognised; pass its name with "
    "--kill-pattern so its whole job tree is stopped",
}


def _state_advice(i: int, s: GpuIdleState) -> str | None:
    if s.state is GpuState.PHANTOM:
        return f"GPU{i}: {s.detail}; {HEAL_ADVICE}"
    if s.state is GpuState.UNKNOWN:
        return f"GPU{i}: {s.detail}; run `podguard doctor`, and if the GPU is lost, {HEAL_ADVICE}"
    return None


def recommend(
    plan: CleanupPlan,
    actions: Sequence[KillRecord],
    skipped: Sequence[Skipped],
    states: Mapping[int, GpuIdleState],
    respawners: Sequence[Respawner] = (),
) -> list[str]:
    recs = [text for i, s in sorted(states.items()) if (text := _state_advice(i, s)) is not None]
    recs += [
        f"pid {a.pid} ({a.cmdline[:80]}) {unkillable_text(a.state)}" for a in actions if a.outcome is Outcome.UNKILLABLE
    ]
    for r in respawners:
        if not r.stopped:
            recs.append(
                f"pid {r.pid} ({r.cmdline[:80]}) keeps starting holders of {gpus_text(r.gpus)} "
                f"(pid {', '.join(map(str, r.children))}) and was left running: {r.reason or 'stop it yourself'}"
            )
    selected = set(plan.config.gpus)
    for s in skipped:
        template = _SKIP_ADVICE.get(s.code)
        if template is not None and (selected.intersection(s.gpus) or s.code is SkipCode.RESPAWN_LIMIT):
            recs.append(template.format(gpus=gpus_text(s.gpus), pid=s.pid, cmd=s.cmdline[:80]))
    return list(dict.fromkeys(recs))


def starters_still_running(actions: Sequence[KillRecord], config: PlanConfig) -> list[str]:
    """Name the still-running parents of stopped jobs that could start them again (a `while true` loop in
    a wrapper script): podguard stops them only once it sees them respawn, so the user should know."""
    roots = {a.tree: a for a in actions if a.pid == a.tree and a.stopped}
    if not roots:
        return []
    table = scan_processes(config.dev_dir, fds=False)
    policy = Policy(table, config)
    out: list[str] = []
    for root, record in sorted(roots.items()):
        parent = table.get(record.parent)
        if parent is None or parent.zombie or parent.interactive_shell or policy.excluded(parent) is not None:
            continue
        out.append(
            f"pid {parent.pid} ({parent.safe_command[:80]}) started the stopped job {root} and is still running; if "
            "it starts the job again, name it with --kill-pattern so its whole tree is stopped"
        )
    return out
