"""A stand-in GPU process, and the registry format the fake NVML reads.

Why: cleanup must be tested against REAL processes (real PIDs, real open device files, real signals), so
this script plays a CUDA process: it opens `<dev_dir>/nvidiactl` and `<dev_dir>/nvidia<gpu>` (plain files
in tests; what PODGUARD_DEV_DIR points to), registers its "context" with the fake NVML, signals readiness
through a ready file, and sleeps until killed. The fake lists it only while it is alive, and its memory
comes back when it dies, like the driver.

It is run as a script (`python -S -E gpuproc.py ...`) and uses only the standard library, so it starts
fast and works whatever the caller's environment is. Modes:

* ``holder``   (default) holds one GPU; options: --ignore-sigterm, --no-register, --fork-child
               (a DataLoader-like child inherits the device files; it is NOT registered with NVML but
               keeps the memory in use while alive).
* ``monitor``  opens only nvidiactl (like nvidia-smi or a metrics exporter): not a GPU holder.
               With --open-all it opens every nvidia<N> too, as any process that called nvmlInit does.
* ``idle``     opens nothing (a bystander such as `sshd` or `jupyter` that cleanup must never touch).
* ``launcher`` a `torchrun`-like parent that starts a holder worker and respawns it whenever it dies
               (after --respawn-delay-s); on SIGTERM it forwards SIGTERM to the worker, waits a grace
               period, then kills it and exits. Named otherwise (--name), a plain respawning parent.

Registry: one file per process in the registry dir, named by PID, written atomically. One line per GPU:
``gpu=<index> mem_mib=<n> kind=compute start=<starttime> [also=<pid>,<pid>]`` where `start` is field 22
of /proc/<pid>/stat (so a recycled PID does not count) and `also` lists processes that share the context's
device file (forked children): the memory stays in use while any of them lives.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1


def proc_start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat (clock ticks since boot): with the PID, identifies a process."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        data = fh.read()
    return int(data[data.rindex(b")") + 2 :].split()[19])


def registry_text(
    gpus: Iterable[int],
    mem_mib: int,
    *,
    kind: str = "compute",
    start: int | None = None,
    also: Sequence[int] = (),
    mig: int | None = None,
) -> str:
    extra = f" start={start}" if start else ""
    if mig is not None:
        extra += f" mig={mig}"
    if also:
        extra += " also=" + ",".join(str(p) for p in also)
    return "".join(f"gpu={g} mem_mib={mem_mib} kind={kind}{extra}\n" for g in gpus)


def register_process(
    procs_dir: Path,
    pid: int,
    gpu: int | Sequence[int],
    mem_mib: int,
    *,
    kind: str = "compute",
    also: Sequence[int] = (),
    check_start: bool = True,
    mig: int | None = None,
) -> Path:
    """Register `pid` as holding `mem_mib` MiB on `gpu` (one index or several). Atomic (temp + rename)."""
    procs_dir = Path(procs_dir)
    procs_dir.mkdir(parents=True, exist_ok=True)
    gpus = [gpu] if isinstance(gpu, int) else list(gpu)
    start = None
    if check_start:
        with contextlib.suppress(OSError):
            start = proc_start_time(pid)
    path = procs_dir / str(pid)
    tmp = procs_dir / f".{pid}.{os.getpid()}.tmp"
    tmp.write_text(registry_text(gpus, mem_mib, kind=kind, start=start, also=also, mig=mig))
    os.replace(tmp, path)
    return path


def unregister_process(procs_dir: Path, pid: int) -> None:
    """Forget `pid` (the fake would ignore it anyway once it is dead)."""
    with contextlib.suppress(FileNotFoundError):
        (Path(procs_dir) / str(pid)).unlink()


def write_ready(path: Path, values: dict[str, object]) -> None:
    """Atomically write `key=value` lines: the spawner polls for this file, so it must appear whole."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    os.replace(tmp, path)


def read_ready(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition("=")
        if key:
            out[key] = value
    return out


def set_process_name(name: str) -> None:
    """prctl(PR_SET_NAME): what /proc/<pid>/comm, ps and pkill see (15 bytes max)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _sleep_forever() -> None:
    while True:
        signal.pause()


def _open_devices(dev_dir: Path, gpu: int | None, open_all: bool = False) -> list[int]:
    """Open the device files like a CUDA process does (they must exist: never create files in /dev).
    `open_all`: also every nvidia<N>, as nvmlInit does in any process that merely reads NVML."""
    names = ["nvidiactl"]
    if gpu is not None:
        if (dev_dir / "nvidia-uvm").exists():
            names.append("nvidia-uvm")
        names.append(f"nvidia{gpu}")
    if open_all:
        names += sorted(p.name for p in dev_dir.glob("nvidia[0-9]*") if p.name not in names)
    return [os.open(dev_dir / n, os.O_RDWR) for n in names]


def run_holder(args: argparse.Namespace) -> None:
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.open_delay_s > 0:
        time.sleep(args.open_delay_s)  # like a training script importing torch before it touches the GPU
    gpu = None if args.mode == "monitor" else args.gpu
    fds = [] if args.mode == "idle" else _open_devices(Path(args.dev_dir), gpu, args.open_all)
    child = 0
    if args.fork_child and args.mode == "holder":
        child = os.fork()
        if child == 0:  # the DataLoader-like worker: inherits the device fds, not registered
            if args.child_dies_with_parent:
                _die_with_parent()
            set_process_name("pt_data_worker")
            _sleep_forever()
    if args.mode == "holder" and args.register:
        register_process(
            Path(args.procs_dir),
            os.getpid(),
            args.gpu,
            args.mem_mib,
            kind=args.kind,
            also=[child] if child else (),
            mig=args.mig,
        )
    ready: dict[str, object] = {"pid": os.getpid(), "start": proc_start_time(os.getpid()), "fds": len(fds)}
    if child:
        ready.update(child=child, child_start=proc_start_time(child))
    write_ready(Path(args.ready_file), ready)
    _sleep_forever()


class _Stop(Exception):
    """Raised from the launcher's SIGTERM handler to leave a blocking wait."""


def run_launcher(args: argparse.Namespace) -> None:
    ready_file = Path(args.ready_file)
    workers_file = ready_file.with_name(ready_file.name + ".workers")
    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            raise _Stop

    signal.signal(signal.SIGTERM, on_term)
    worker: subprocess.Popen[bytes] | None = None
    spawned = 0
    try:
        while True:
            worker_ready = ready_file.with_name(f"{ready_file.name}.worker{spawned}")
            cmd = [
                args.worker_name,
                "-S",
                "-E",
                os.path.abspath(__file__),
                "--mode=holder",
                f"--gpu={args.gpu}",
                f"--mem-mib={args.mem_mib}",
                f"--dev-dir={args.dev_dir}",
                f"--procs-dir={args.procs_dir}",
                f"--kind={args.kind}",
                f"--open-delay-s={args.open_delay_s}",
            ]
            if args.ignore_sigterm:
                cmd.append("--ignore-sigterm")
            if not args.register:
                cmd.append("--no-register")
            # The ready file goes through the environment: a respawned worker has the very same argv.
            env = {**os.environ, "GPUPROC_READY_FILE": str(worker_ready)}
            worker = subprocess.Popen(cmd, executable=args.python, env=env)
            deadline = time.monotonic() + 10.0
            while not worker_ready.exists():
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"launcher: worker failed to start (rc={worker.returncode})")
                time.sleep(0.002)
            info = read_ready(worker_ready)
            with workers_file.open("a") as fh:
                fh.write(f"{info['pid']} {info['start']}\n")
            if spawned == 0:
                start = proc_start_time(os.getpid())
                write_ready(ready_file, {"pid": os.getpid(), "start": start, "worker": info["pid"]})
            spawned += 1
            worker.wait()
            if spawned > args.max_respawns:
                raise SystemExit("launcher: too many respawns")
            if args.respawn_delay_s > 0:
                time.sleep(args.respawn_delay_s)  # a respawning script's back-off before it tries again
    except _Stop:
        if worker is not None and worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(timeout=args.grace_s)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        sys.exit(128 + signal.SIGTERM)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="stand-in GPU process for podguard's tests")
    parser.add_argument("--mode", choices=("holder", "monitor", "idle", "launcher"), default="holder")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--mem-mib", type=int, default=1024)
    parser.add_argument("--dev-dir", required=True)
    parser.add_argument("--procs-dir", required=True)
    parser.add_argument("--ready-file", default=os.environ.get("GPUPROC_READY_FILE"))
    parser.add_argument("--kind", choices=("compute", "graphics"), default="compute")
    parser.add_argument("--open-delay-s", type=float, default=0.0, help="wait before opening the devices")
    parser.add_argument("--open-all", action="store_true", help="also open every nvidia<N> (as nvmlInit does)")
    parser.add_argument("--mig", type=int, default=None, help="the MIG slot of the GPU it runs on")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--no-register", dest="register", action="store_false")
    parser.add_argument("--fork-child", action="store_true")
    parser.add_argument("--child-dies-with-parent", action="store_true")
    parser.add_argument("--name", default=None, help="process name (prctl PR_SET_NAME)")
    parser.add_argument("--python", default=sys.executable, help="launcher: interpreter for workers")
    parser.add_argument("--worker-name", default="python", help="launcher: argv[0] of workers")
    parser.add_argument("--max-respawns", type=int, default=50)
    parser.add_argument("--grace-s", type=float, default=1.0)
    parser.add_argument("--respawn-delay-s", type=float, default=0.0, help="launcher: pause before a respawn")
    args = parser.parse_args(argv)
    if not args.ready_file:
        parser.error("--ready-file (or GPUPROC_READY_FILE) is required")
    if args.name:
        set_process_name(args.name)
    if args.mode == "launcher":
        run_launcher(args)
    else:
        run_holder(args)


if __name__ == "__main__":
    main()
