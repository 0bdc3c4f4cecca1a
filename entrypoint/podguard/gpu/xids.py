"""NVIDIA's Xid catalogue as podguard uses it: one table of meanings, and the sets that decide what each does.

    xid_meaning(79)           # "GPU has fallen off the bus"
    79 in HARDWARE_XIDS       # the gate fails a GPU that reports it during its window
    79 in RUN_FATAL_XIDS      # the run-time watch ends a running job on it (docs/watch.md, "GPU faults")

Source: NVIDIA's "XID Errors" catalogue (docs.nvidia.com/deploy/xid-errors); why each run-time Xid is fatal:
docs/watch.md ("Which Xids end the job").
"""

from __future__ import annotations

__all__ = ["APPLICATION_XIDS", "HARDWARE_XIDS", "RUN_FATAL_XIDS", "XID_MEANINGS", "xid_meaning"]

XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapping recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}

# The job's own faults on a healthy GPU: printed naming the GPU, never a hardware verdict nor acted on.
APPLICATION_XIDS = frozenset({13, 31, 43, 45})
# The hardware or driver needs attention: the gate fails a GPU that reports one of these in its window.
HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
# A running job ends on these (docs/watch.md, "Which Xids end the job"); 61, 62, 63, 92 and 140 are named but do not
# end it (NVIDIA asks no immediate action for 63 or 92 alone).
RUN_FATAL_XIDS = frozenset({48, 64, 74, 79, 94, 95, 119, 120})


def xid_meaning(xid: int) -> str:
    """NVIDIA's meaning of an Xid, as far as podguard names it."""
    return XID_MEANINGS.get(xid, "see NVIDIA's Xid catalogue")
