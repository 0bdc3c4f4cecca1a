"""Another podguard run on this node, for tests of concurrent runs: a real process holding a real GPU lease
(podguard's own lease code) with stand-in GPU processes started under it.

    run = LeasedRun(node, "0", [{"gpu": 0, "kw": {"open_all": True}}])
    run.pid, run.kids   # the lease holder, and its job's processes
    run.stop()          # releases the lease; run.kill() SIGKILLs the holder only (its kids become orphans)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from .holders import pid_alive
from .node import NvmlNode

TESTS = Path(__file__).resolve().parents[1]

_RUN = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from fakenvml.holders import spawn_gpu_holder
    from podguard.gpu.factory import open_backend
    from podguard.preflight.leases import acquire_gpus
    from podguard.preflight.selection import select_gpus
    cfg = json.loads(sys.argv[2])
    backend = open_backend()
    inventory = [backend.snapshot(i) for i in range(backend.device_count())]
    backend.close()
    selection = select_gpus(inventory, gpu_list=cfg["lease"])
    command = "podguard train -- python a.py --hf_token hf_abcdefghijklmnopqrstuvwx"  # a secret in argv
    with acquire_gpus(selection.gpus, explicit=True, command=command):
        kids = [spawn_gpu_holder(k["gpu"], 1024, Path(cfg["dev"]), Path(cfg["procs"]), **k.get("kw", {}))
                for k in cfg["kids"]]
        print(json.dumps({"pid": os.getpid(), "kids": [k.pid for k in kids]}), flush=True)
        sys.stdin.read()
        for k in kids:
            k.kill_all()
    """
)


class LeasedRun:
    """Another podguard run on this host: holds a lease on `lease` and runs `kids` under it.
    `kids`: spawn_gpu_holder arguments, e.g. {"gpu": 1, "kw": {"mig": 0}}."""

    def __init__(self, node: NvmlNode, lease: str, kids: list[dict[str, Any]]) -> None:
        cfg = {"lease": lease, "dev": str(node.dev_dir), "procs": str(node.procs_dir), "kids": kids}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _RUN, str(TESTS), json.dumps(cfg)],
            env=node.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "run A did not start"
        info = json.loads(line)
        self.pid: int = info["pid"]
        self.kids: list[int] = info["kids"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.kids:
            if pid_alive(pid):
                os.kill(pid, 9)

    def kill(self) -> None:
        """SIGKILL the lease holder only (the kernel drops its lease; its kids are left as orphans)."""
        self.proc.kill()
        self.proc.wait()
