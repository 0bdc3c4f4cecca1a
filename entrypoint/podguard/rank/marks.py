"""The marks the torchrun rank wrapper (rank/wrap.py) puts on its lines for podguard's line handling to read.

    line = HIDDEN + b"rank1: step 5\\n"     # to the log files and the watch, never to the terminal
    line = b"rank0: " + ACTIVITY + b"\\n"   # "rank0 wrote output without a line end": activity for the watch only

Both are OSC strings: a terminal that got one would show nothing. They live here, below launch/ (whose
launch/lines.py acts on them), because the wrapper runs inside each worker and imports nothing of launch/.
"""

from __future__ import annotations

__all__ = ["ACTIVITY", "HIDDEN"]

# Put before a line that goes to the log files and the watch but not to the terminal (the torchrun rank
# wrapper marks the lines of ranks `--only-gpu` hides).
HIDDEN = b"\x1b]podguard-hidden\x07"
# A line that only says "this rank wrote output without a line end" (a dot per step): the torchrun rank wrapper holds
# a partial line until its end (ranks never interleave mid-line) and sends this instead, at most once a second. It
# is activity for the watch and goes nowhere else.
ACTIVITY = b"\x1b]podguard-activity\x07"
