"""What a hung job's stacks say: where each rank waits, and which rank the others wait for.

    collective_of(main_thread_frames, user_index)   # "all_reduce", "backward's gradient all-reduce", or None
    hang_summary(stacks)                            # one line per rank, then which ranks differ

A rank *waits in a collective* when its main thread is inside a torch.distributed call (all_reduce, barrier, ...),
or inside the waits that DDP, FSDP and DeepSpeed put in `backward` and `step`: DDP's gradient all-reduce runs in
C++ hooks inside the autograd engine, so py-spy shows the rank's innermost Python frame as autograd's entry
(`_engine_run_backward` in torch/autograd/graph.py; `backward` in torch/autograd/__init__.py before torch 2.3)
with no collective frame; FSDP (`_unshard`, `_wait_for_post_backward`, FSDP2's `foreach_all_gather`,
`wait_for_unshard`, `foreach_reduce`) and DeepSpeed (`allreduce_gradients`, `average_tensor`,
`reduce_ipg_grads`, its `deepspeed.comm` calls) name theirs in Python. Ranks that wait while others are
elsewhere name the others as the likely stuck ranks, where those are no more than the waiting ones (on NCCL most
waiting ranks block in a GPU sync such as `.item()`, with no collective frame: three ranks at one `.item()` and
one in a barrier do not make three stuck ranks). Only the ranks are compared: a launcher (mp.spawn's
parent), multiprocessing helpers and a rank's own children (data-loader workers) keep their stacks but are not
in the verdict. docs/watch.md, "Stacks".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from podguard.launch.watch.stack_model import Frame, RankStacks

__all__ = [
    "ASYNC_WAIT",
    "BACKWARD_WAIT",
    "COLLECTIVES",
    "FRAMEWORK_WAITS",
    "RENDEZVOUS",
    "collective_of",
    "group_ranks",
    "hang_summary",
]

COLLECTIVES = frozenset(
    {
        "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
        "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list", "reduce",
        "reduce_scatter", "reduce_scatter_tensor", "gather", "gather_object", "scatter", "scatter_object_list",
        "send", "recv", "isend", "irecv", "batch_isend_irecv", "wait", "synchronize",
    }
)  # fmt: skip
FRAMEWORK_WAITS = frozenset(
    {
        # DDP outside backward: buffers and parameters broadcast in forward and at construction
        "_sync_buffers", "_sync_module_states", "_sync_params_and_buffers", "_distributed_broadcast_coalesced",
        "_verify_param_shape_across_processes",
        # FSDP (1 and 2): parameters gathered before use, gradients reduced after backward
        "_unshard", "_wait_for_post_backward", "_post_backward_hook", "_reduce_grad", "_all_gather_flat_param",
        "foreach_all_gather", "foreach_all_gather_copy_out", "wait_for_unshard", "foreach_reduce",
        # DeepSpeed ZeRO: gradient reduction in backward, partitions gathered in step
        "allreduce_gradients", "allreduce_bucket", "buffered_allreduce_fallback", "average_tensor",
        "reduce_ipg_grads", "all_gather_dp_groups",
    }
)  # fmt: skip
RENDEZVOUS = frozenset(
    {
        # a process group's start: the store's rendezvous, then the backend connecting to every peer
        "init_process_group", "new_group", "new_subgroups", "new_subgroups_by_enumeration", "init_device_mesh",
        "rendezvous", "_create_c10d_store", "_store_based_barrier", "_new_process_group_helper",
    }
)  # fmt: skip
BACKWARD_WAIT = "backward's gradient all-reduce"
ASYNC_WAIT = "an async collective's wait()"
_ASYNC_WAIT_CALL = re.compile(r"(?<![\w.])(?!os\.)[A-Za-z_][\w.\[\]]*\.wait\(")  # `work.wait()`, `h[0].wait(t)`
_AUTOGRAD_ENTRIES = frozenset({"_engine_run_backward", "run_backward", "backward", "grad"})
STOPPED = "state T: a SIGSTOP, or a debugger holds it"
_LIBRARIES = ("/torch/", "/deepspeed/")
_PROCESS_GROUP_STARTS = frozenset({"init_process_group", "new_group", "init_device_mesh"})


def _name(frame: Frame) -> str:
    """The function's own name (py-spy prints qualified names on 3.11+: `Tensor.backward`)."""
    return frame.function.rsplit(".", 1)[-1]


def _library(frame: Frame) -> bool:
    path = frame.file.replace("\\", "/")
    return any(part in path for part in _LIBRARIES)


def collective_of(
    frames: Sequence[Frame], user_index: int | None, line_of: Callable[[Frame], str] | None = None
) -> str | None:
    """The wait below the user's frame (or anywhere, without one): the outermost torch.distributed call,
    rendezvous or framework wait, else autograd's engine as the innermost Python frame (DDP's all-reduce runs in
    there). An async collective's `work.wait()` is a C++ method with no Python frame of its own: when the user's
    frame is the innermost one and its source line (`line_of`) calls `.wait()`, the rank waits there."""
    inner = frames[:user_index] if user_index is not None else frames
    for f in reversed(inner):  # outermost first: the call the user made, not torch's internal helpers
        name = _name(f)
        if name in RENDEZVOUS and _library(f):
            return f"{name}'s rendezvous" if name in _PROCESS_GROUP_STARTS else "a process group's rendezvous"
        if (name in COLLECTIVES or name in FRAMEWORK_WAITS) and _library(f):
            return name
    if inner and _name(inner[0]) in _AUTOGRAD_ENTRIES and "/torch/autograd/" in inner[0].file.replace("\\", "/"):
        return BACKWARD_WAIT
    if user_index == 0 and line_of is not None and _ASYNC_WAIT_CALL.search(line_of(frames[0])):
        return ASYNC_WAIT
    return None


def group_ranks(ranks: Sequence[int | None]) -> str:
    """'rank 1', 'ranks 0, 2-5' (None: left out)."""
    numbers = [r for r in ranks if r is not None]
    word = "rank" if len(numbers) == 1 else "ranks"
    return f"{word} {', '.join(_spans(sorted(numbers)))}"


def _spans(numbers: Sequence[int]) -> list[str]:
    parts, i = [], 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] + 1:
            j += 1
        parts.append(str(numbers[i]) if i == j else f"{numbers[i]}-{numbers[j]}")
        i = j + 1
    return parts


def _ranks(items: Sequence[RankStacks]) -> str:
    """'rank 1', 'ranks 0, 2-5' (workers without a rank by name)."""
    numbers = sorted(s.target.rank for s in items if s.target.rank is not None)
    parts, i = [], 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] + 1:
            j += 1
        parts.append(str(numbers[i]) if i == j else f"{numbers[i]}-{numbers[j]}")
        i = j + 1
    names = [s.target.name for s in items if s.target.rank is None]
    if not numbers:
        return ", ".join(names)
    word = "rank" if len(items) == 1 else "ranks"
    return f"{word} {', '.join(parts + names)}"


def _state(s: RankStacks, plural: bool = False) -> str:
    """'waits in all_reduce at train.py:57 in step' / 'is at data.py:12 in load_batch' (plural: wait / are)."""
    where = s.innermost_user_frame or "no frame of the user's code"
    if s.stopped:
        return f"{'are' if plural else 'is'} stopped ({STOPPED}) at {where}"
    if s.collective:
        return f"{'wait' if plural else 'waits'} in {s.collective} at {where}"
    return f"{'are' if plural else 'is'} at {where}"


def _rank_line(s: RankStacks) -> str:
    stopped = f" (stopped: {STOPPED})" if s.stopped else ""
    if s.error:
        return f"{s.target.label}: no stacks: {s.error}{stopped}"
    where = s.innermost_user_frame or "(no frame of the user's code)"
    return f"{s.target.label}: {where}" + (f" (in {s.collective})" if s.collective else "") + stopped


def _group(items: Sequence[RankStacks]) -> str:
    return f"{_ranks(items)} {_state(items[0], plural=len(items) > 1)}"


def _stopped_verdict(ranks: Sequence[RankStacks], good: Sequence[RankStacks]) -> str | None:
    """A rank that is stopped (state T) while others are not is the likely stuck one, whatever they do."""
    stopped = [s for s in ranks if s.stopped]
    if not stopped or len(stopped) == len(ranks):
        return None
    groups: dict[str, list[RankStacks]] = {}
    for s in good:
        if not s.stopped:
            groups.setdefault(_state(s), []).append(s)
    parts = [_group(g) for g in sorted(groups.values(), key=len, reverse=True)]
    parts.append(f"{_ranks(stopped)} {'is' if len(stopped) == 1 else 'are'} stopped ({STOPPED})")
    who = "is the likely stuck rank" if len(stopped) == 1 else "are the likely stuck ranks"
    return "; ".join(parts) + f": {_ranks(stopped)} {who}"


def _verdict(good: Sequence[RankStacks]) -> str | None:
    """Which ranks differ from the rest, and the likely stuck one."""
    if len(good) < 2:
        return None
    groups: dict[str, list[RankStacks]] = {}
    for s in good:
        groups.setdefault(_state(s), []).append(s)
    ordered = sorted(groups.values(), key=len, reverse=True)
    if len(ordered) == 1:
        return f"all {len(good)} ranks {_state(good[0], plural=True)}: none differs (the stuck one may be elsewhere)"
    waiting = [g for g in ordered if g[0].collective]
    outside = [g for g in ordered if not g[0].collective]
    stuck = sum(len(g) for g in outside)
    if waiting and outside and stuck <= len(good) - stuck:  # a collective waits for the (fewer) ranks outside it
        who = "is the likely stuck rank" if stuck == 1 else "are the likely stuck ranks"
        return "; ".join(_group(g) for g in waiting + outside) + f": {_ranks([s for g in outside for s in g])} {who}"
    if len(ordered[0]) * 2 <= len(good):
        return "the ranks are at different places: " + "; ".join(_group(g) for g in ordered)
    differ = [s for g in ordered[1:] for s in g]
    verb = "differs" if len(differ) == 1 else "differ"
    return "; ".join(_group(g) for g in ordered) + f": {_ranks(differ)} {verb} from the rest"


def hang_summary(stacks: Sequence[RankStacks]) -> list[str]:
    """One line per rank ('rank N (GPU i): <innermost frame of the user's code>'), then which ranks differ
    from the rest and the likely stuck one; missing stacks say why. Processes that are not ranks (a launcher,
    helpers, data-loader workers) are counted in one line: their stacks are kept, not compared."""
    ranks = [s for s in stacks if s.target.role == "rank"]
    others = [s for s in stacks if s.target.role != "rank"]
    lines = [_rank_line(s) for s in ranks or stacks]
    good = [s for s in ranks if not s.error]
    verdict = _stopped_verdict(ranks, good) or _verdict(good)
    if verdict:
        lines.append(verdict)
    if ranks and others:
        kept = sum(1 for s in others if not s.error)
        roles = ", ".join(sorted({s.target.role for s in others}))
        lines.append(f"also kept: the stacks of {kept} of {len(others)} other process(es) ({roles}), not compared")
    errors = {s.error for s in stacks if s.error}
    if stacks and not any(not s.error for s in stacks) and len(errors) == 1:
        lines.append(f"no stacks were taken: {next(iter(errors))}")
    return lines
