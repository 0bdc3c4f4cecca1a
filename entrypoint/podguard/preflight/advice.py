"""What a failed preflight tells the user to do next: the recommendations its summary and report carry.

recommendations(ExitCode.GPUS_BUSY, gate, nvml_failure=None, cleanup=result)   # ["retry later, or ..."]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from podguard.errors import ExitCode
from podguard.preflight.gate.rules import Finding, GateResult

if TYPE_CHECKING:
    from podguard.preflight.cleanup.vocabulary import CleanupResult

__all__ = ["recommendations"]


def recommendations(
    exit_code: int, gate: GateResult | None, nvml_failure: str | None, cleanup: CleanupResult | None
) -> list[str]:
    """The next steps for this outcome, each once, in order (the cleanup's own recommendations last)."""
    recs: list[str] = []
    if nvml_failure:
        recs.append("stop and start the pod (a container restart keeps the same driver state), or move machines")
    if exit_code == ExitCode.GPUS_BUSY:
        recs.append("retry later, or run `podguard cleanup` / `podguard doctor` to see who holds the GPUs")
        if gate is not None and gate.has(Finding.PHANTOM_MEMORY):
            recs.append("phantom memory persists across container restarts: stop and start the pod")
    if exit_code == ExitCode.GPU_UNHEALTHY and gate is not None:
        recs.append(  # (the message above named the GPUs)
            "exclude them with GPU_LIST, or stop and start the pod (`podguard pod heal`), or move to another machine"
        )
        if gate.has(Finding.DEGRADED):
            recs.append(
                "a degraded GPU works but slows every rank down: --degraded exclude runs on the others, "
                "--degraded warn runs on all of them anyway"
            )
    if exit_code == ExitCode.GPUS_MISSING and gate is not None and gate.excluded:
        recs.append(
            "too few GPUs left after excluding the degraded ones: lower NPROC_PER_NODE, use --on-fewer-gpus "
            "continue, or move to another machine (`podguard pod heal --replace`)"
        )
    if cleanup is not None:
        recs.extend(cleanup.recommendations)  # printed, not only stored
    return list(dict.fromkeys(recs))
