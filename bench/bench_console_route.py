"""What a podguard line said by a helper thread costs while a supervisor runs (launch/route.py), against the same
line written straight to stderr (no run): the saying thread's time per line, and whether every line reached the
terminal. The route queues the line and wakes the loop; the loop writes it with the workers' lines.

Run: `python bench/bench_console_route.py [--lines 20000]`
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import threading
import time

from _common import ROOT  # noqa: F401  (puts the package on sys.path)

from podguard import console
from podguard.launch.run import run_job
from podguard.launch.spec import WorkerSpec


def _say(n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        console.say(f"tick {i}")
    return time.perf_counter() - t0


class _Chatter:
    """A Watch whose thread says `n` lines during the run (a mirror-like helper thread)."""

    def __init__(self, n: int) -> None:
        self.n, self.took = n, 0.0
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        self.took = _say(self.n)

    def start(self, sup: object) -> None:
        self.thread.start()

    def close(self) -> None:
        self.thread.join()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=20000)
    n = parser.parse_args().lines
    stderr, sys.stderr = sys.stderr, open(os.devnull, "w")  # noqa: SIM115  (the direct case's target)
    try:
        direct = _say(n)
        chatter, out = _Chatter(n), io.BytesIO()
        job = [WorkerSpec("job", (sys.executable, "-c", "import time; time.sleep(3)"))]
        run_job(job, terminal=out, watch=chatter, summary=False)
    finally:
        sys.stderr.close()
        sys.stderr = stderr
    shown = sum(1 for line in out.getvalue().decode().splitlines() if line.startswith("podguard: tick"))
    print(f"console.say to stderr (no run): {direct / n * 1e6:.1f} us/line")
    print(f"console.say from a thread during a run (routed to the terminal): {chatter.took / n * 1e6:.1f} us/line")
    print(f"lines on the terminal: {shown} of {n}")


if __name__ == "__main__":
    main()
