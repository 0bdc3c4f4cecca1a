"""`--degraded exclude`: run on the GPUs left after the degraded ones, when they still meet what the job needs.

    outcome = exclude_degraded(selection, gate.excluded, nproc_per_node="8", on_fewer=OnFewer.FAIL)
    outcome.selection          # the GPUs to run on, or None: 69 with outcome.message

What is left must satisfy NPROC_PER_NODE and the expected count (RUNPOD_GPU_COUNT / --expect-gpus), unless
`--on-fewer-gpus continue` says to run on fewer (a loud warning). Excluded GPUs stay leased for the run, so no
other podguard run lands on them meanwhile. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from podguard.gpu.selected import Selection
from podguard.preflight.gate.rules import GpuVerdict
from podguard.preflight.options import OnFewer
from podguard.preflight.selection import parse_count

__all__ = ["Exclusion", "exclude_degraded"]


@dataclass(frozen=True)
class Exclusion:
    selection: Selection | None  # None: too few GPUs left (exit 69, `message` says why)
    message: str = ""
    warnings: tuple[str, ...] = ()


def exclude_degraded(
    selection: Selection, excluded: Sequence[GpuVerdict], *, nproc_per_node: str | None, on_fewer: OnFewer
) -> Exclusion:
    out = {v.index for v in excluded}
    why = "; ".join(f"GPU{v.index} {', '.join(d.text for d in v.degraded)}" for v in excluded)
    rest = tuple(g for g in selection.gpus if g.index not in out)
    left = len({g.index for g in rest})
    nproc = parse_count(nproc_per_node, "NPROC_PER_NODE", minimum=1)
    short = []
    if nproc is not None and left < nproc:
        short.append(f"NPROC_PER_NODE={nproc}")
    if selection.expected and selection.inventory_count - len(out) < selection.expected:
        short.append(f"the expected {selection.expected} GPUs (RUNPOD_GPU_COUNT / --expect-gpus)")
    said = f"excluded degraded GPU(s) {_ids(out)} ({why})"
    if not left or (short and on_fewer == OnFewer.FAIL):
        needs = f"fewer than {' and '.join(short)} needs" if short else "nothing to run on"
        return Exclusion(None, f"{said}: {left} GPU(s) left, {needs}")
    warnings = []
    if short:
        warnings.append(
            f"FEWER GPUS THAN EXPECTED: {' and '.join(short)}; continuing with {left} (--on-fewer-gpus continue)"
        )
    warnings.append(f"{said}; running on GPU(s) {_ids({g.index for g in rest})}")
    return Exclusion(replace(selection, gpus=rest), warnings=tuple(warnings))


def _ids(indices: set[int]) -> str:
    return ",".join(map(str, sorted(indices)))
