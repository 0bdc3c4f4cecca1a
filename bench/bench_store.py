"""What the checkpoint store costs (`--checkpoint-store`, issue 31), against moto's S3 server on loopback (its own
process, pinned to the last CPU so that it does not take the job's).

    python bench/bench_store.py [--quick] [--size-mb 512] [--restore-gb 2] [--only upload|steps|restore]

1. Upload throughput of one checkpoint (a folder of two files, --size-mb in all): podguard's upload
   (store/upload.py: its CRC-32 pass, boto3's transfer manager with 50 MB parts, HeadObject, the manifest) beside
   boto3's own transfer manager (`client.upload_file`, its defaults) and obstore (`obstore.put`) on the same server,
   interleaved, median of 3; and the CPU seconds each took in this process (podguard's beyond boto3's = the cost
   of its checks).
2. Step time of a job that saves a 40 MB checkpoint every 3 s, under `podguard run --checkpoints` for 30 s,
   without a store, with `s3://` (moto) and with `file://`, then without a store again (the noise); the median step
   and podguard's own CPU (% of a core, from /proc) in each.
3. Restore time of a --restore-gb checkpoint (two files) into an empty DIR: download, CRC-32 check, rename.
`--quick`: 64 MB, 10 s runs, a 256 MB restore.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import PODGUARD, ROOT, fake_node, node_env

sys.path.insert(0, str(ROOT / "entrypoint"))
sys.path.insert(0, str(ROOT / "tests" / "store"))

from s3server import CREDENTIALS, S3Server, store_env

from podguard import console
from podguard.checkpoints import find_checkpoints
from podguard.store.catalog import newest_whole
from podguard.store.connect import open_backend
from podguard.store.restore import restore_checkpoint
from podguard.store.upload import upload_checkpoint
from podguard.store.url import parse_store_url

JOB = """
import os, sys, time, torch
d = os.environ["PODGUARD_CHECKPOINTS"]; seconds, every_s, mb = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1); os.makedirs(d, exist_ok=True)
a = torch.randn(384, 384)
state = {"w": torch.randn(mb * 2**20 // 4)}
start = last_save = time.monotonic(); step = 0; times = []
while time.monotonic() - start < seconds:
    t = time.perf_counter()
    for _ in range(8):
        a = torch.tanh(a @ a / 384)
    step += 1
    if time.monotonic() - last_save >= every_s:
        last_save = time.monotonic()
        torch.save({"step": step, **state}, f"{d}/.step-{step}.pt.tmp")
        os.replace(f"{d}/.step-{step}.pt.tmp", f"{d}/step-{step}.pt")
        for old in sorted(os.listdir(d)):
            if old.startswith("step-") and old != f"step-{step}.pt":
                os.unlink(os.path.join(d, old))
    times.append(time.perf_counter() - t)
times.sort()
print(f"STEPS {step} median_ms {1000 * times[len(times) // 2]:.3f} mean_ms {1000 * sum(times) / len(times):.3f}")
"""


def pin_last_cpu(pid: int) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        os.sched_setaffinity(pid, {cpus[-1]})


def make_checkpoint(root: Path, name: str, total: int) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    half = total // 2
    for part in ("model-00001-of-00002.bin.data", "optimizer.bin.data"):
        with open(folder / part, "wb") as f:
            left = half
            while left:
                n = min(left, 16 << 20)
                f.write(os.urandom(n))
                left -= n
    (folder / "COMPLETED").write_text("")
    return folder


def throughput(server: S3Server, size_mb: int, repeats: int) -> None:
    import boto3
    import obstore
    from obstore.store import S3Store

    tmp = Path(tempfile.mkdtemp(prefix="podguard-bench-store-"))
    try:
        folder = make_checkpoint(tmp / "dir", "step_100", size_mb * 2**20)
        files = sorted(p for p in folder.iterdir() if p.is_file())
        total = sum(p.stat().st_size for p in files)
        checkpoint = find_checkpoints(tmp / "dir").chosen
        assert checkpoint is not None and checkpoint.whole, checkpoint
        client = boto3.client("s3", endpoint_url=server.url, region_name="us-east-1", **_creds())
        ob = S3Store("bench", endpoint=server.url, region="us-east-1", client_options={"allow_http": True},
                     access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                     secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
        backend = open_backend(parse_store_url("s3://bench/podguard"))

        def boto3_tm() -> None:
            for p in files:
                client.upload_file(str(p), "bench", f"boto3/step_100/{p.name}")

        def podguard_upload() -> None:
            upload_checkpoint(backend, checkpoint, str(tmp / "dir"), progress=lambda n: None)

        def obstore_put() -> None:
            for p in files:
                with open(p, "rb") as f:
                    obstore.put(ob, f"obstore/step_100/{p.name}", f)

        cases = {"boto3 transfer manager": boto3_tm, "podguard upload": podguard_upload, "obstore put": obstore_put}
        wall: dict[str, list[float]] = {k: [] for k in cases}
        cpu: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(repeats):
            for name, fn in cases.items():
                c0, t0 = time.process_time(), time.perf_counter()
                fn()
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
        print(f"1. upload of one {total / 1e6:.0f} MB checkpoint (2 files) to moto's S3 server, median of {repeats}")
        base = statistics.median(wall["boto3 transfer manager"])
        for name in cases:
            w, c = statistics.median(wall[name]), statistics.median(cpu[name])
            print(f"   {name:24s} {w:6.2f} s  {total / w / 1e6:7.1f} MB/s  ratio {base / w:4.2f}  "
                  f"CPU {c:5.2f} s in this process")  # fmt: skip
        extra = statistics.median(cpu["podguard upload"]) - statistics.median(cpu["boto3 transfer manager"])
        print(f"   podguard's checks beyond boto3's copy: {extra:+.2f} CPU s ({extra / (total / 1e9):+.2f} s per GB)")
        backend.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _creds() -> dict[str, str]:
    return {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    }


def step_times(server: S3Server, seconds: float, rounds: int) -> None:
    node = fake_node(1)
    tmp = Path(tempfile.mkdtemp(prefix="podguard-bench-steps-"))
    job = tmp / "job.py"
    job.write_text(JOB)
    cases = {"no store": None, "s3:// (moto)": "s3://bench/steps", "file://": f"file://{tmp / 'filestore'}"}
    runs: dict[str, list[tuple[int, float, float, int, float, float]]] = {k: [] for k in cases}
    try:
        print(f"2. a job saving a 40 MB checkpoint every 3 s, {seconds:.0f} s under `podguard run` (CPU only), "
              f"{rounds} interleaved rounds; medians of the rounds")  # fmt: skip
        for r in range(rounds):
            for label, store in cases.items():
                args = ["run", "--checkpoints", str(tmp / f"ckpt-{r}-{len(runs[label])}-{label[:2]}")]
                if store:  # (a store of its own per run: a store holding a newer checkpoint would be restored)
                    args += ["--checkpoint-store", f"{store}-{r}"]
                runs[label].append(_one_run(node, server, job, args, seconds))
        base = statistics.median(x[1] for x in runs["no store"])
        base_mean = statistics.median(x[2] for x in runs["no store"])
        for label, rows in runs.items():
            median = statistics.median(x[1] for x in rows)
            mean = statistics.median(x[2] for x in rows)
            steps = statistics.median(x[0] for x in rows)
            uploads = statistics.median(x[3] for x in rows)
            cpu = statistics.median(x[4] for x in rows)
            share = statistics.median(100 * x[4] / x[5] for x in rows)
            print(f"   {label:14s} steps {steps:6.0f}  median step {median:7.3f} ms ({median / base:5.3f}x)  mean "
                  f"{mean:7.3f} ms ({mean / base_mean:5.3f}x)  uploads {uploads:3.0f}  podguard CPU {cpu:5.2f} s = "
                  f"{share:4.1f} % of a core")  # fmt: skip
        spread = [x[1] for x in runs["no store"]]
        print(f"   (no store, round to round: median step {min(spread):.3f}-{max(spread):.3f} ms)")
    finally:
        node.teardown()
        shutil.rmtree(tmp, ignore_errors=True)


def _one_run(node, server, job: Path, args: list[str], seconds: float) -> tuple[int, float, float, int, float, float]:  # type: ignore[no-untyped-def]
    env = {**node_env(node, LD_LIBRARY_PATH=""), **store_env(server.url), "AWS_MAX_ATTEMPTS": "5"}
    t0 = time.monotonic()
    proc = subprocess.Popen([*PODGUARD, *args, "--", sys.executable, str(job), str(seconds), "3", "40"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    sampler = _CpuSampler(proc.pid)
    out, _ = proc.communicate(timeout=seconds + 180)
    sampler.stop()
    wall = time.monotonic() - t0
    m = re.search(r"STEPS (\d+) median_ms (\S+) mean_ms (\S+)", out)
    if proc.returncode != 0 or m is None:
        raise SystemExit(f"the job failed ({proc.returncode}):\n{out[-3000:]}")
    uploads = len(re.findall(r"podguard: stored ", out))
    return int(m.group(1)), float(m.group(2)), float(m.group(3)), uploads, sampler.seconds, wall


class _CpuSampler:
    """podguard's own CPU seconds (utime + stime of its process, not its children's), read from /proc."""

    def __init__(self, pid: int) -> None:
        import threading

        self.pid = pid
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while not self._stop.is_set():
            try:
                fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
                self.seconds = (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError, ValueError):
                return
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


def restore_time(server: S3Server, gb: float) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="podguard-bench-restore-"))
    try:
        make_checkpoint(tmp / "pod1", "checkpoint-900", int(gb * 1e9))
        backend = open_backend(parse_store_url("s3://bench/restore"))
        t0 = time.perf_counter()
        upload_checkpoint(backend, find_checkpoints(tmp / "pod1").chosen, str(tmp / "pod1"), progress=lambda n: None)
        up = time.perf_counter() - t0
        stored = newest_whole(backend)
        t0 = time.perf_counter()
        with console.captured():  # (its progress lines: not the benchmark's output)
            restore_checkpoint(backend, stored, str(tmp / "pod2"))
        down = time.perf_counter() - t0
        size = stored.manifest.bytes
        print(f"3. a {size / 1e9:.2f} GB checkpoint: upload {up:.1f} s ({size / up / 1e6:.0f} MB/s); restore into an "
              f"empty DIR (download, CRC-32 check, rename) {down:.1f} s ({size / down / 1e6:.0f} MB/s)")  # fmt: skip
        backend.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--size-mb", type=int, default=None)
    parser.add_argument("--restore-gb", type=float, default=None)
    parser.add_argument("--only", choices=("upload", "steps", "restore"), default=None)
    args = parser.parse_args()
    size_mb = args.size_mb or (64 if args.quick else 512)
    restore_gb = args.restore_gb or (0.25 if args.quick else 2.0)
    for key, value in store_env("").items():
        if key != "AWS_ENDPOINT_URL_S3" and not key.startswith("PODGUARD_STORE_PART"):
            os.environ[key] = value
    server = S3Server.start()
    pin_last_cpu(server.proc.pid)
    os.environ["AWS_ENDPOINT_URL_S3"] = server.url
    try:
        server.bucket("bench")
        if args.only in (None, "upload"):
            throughput(server, size_mb, 3)
        if args.only in (None, "steps"):
            step_times(server, 10.0 if args.quick else 20.0, 1 if args.quick else 3)
        if args.only in (None, "restore"):
            restore_time(server, restore_gb)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
