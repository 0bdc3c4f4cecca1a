"""Log multiplexing: podguard's printer vs `torchrun --tee 3`, same workload, side by side.

Workload: W workers (default 8) each write N lines (default 100 000) to stdout: lengths from 8 bytes to
~4 KB (2 % long lines), 10 % ending in '\\r' or '\\r\\n' (progress bars, Windows tools), written with
`os.write` in random-size chunks (1 B - 64 KiB) that cut lines anywhere (partial writes). Every line is
self-checking: `w<rank> <seq> <payload> <length>`. The bytes are generated before the clock starts,
so the workers only copy them into their stdout: what is measured is the launchers' log path.

* podguard: `per_gpu_specs(..., nproc=W)` + `run_job` in a fresh process, stdout to a file; prefix
  `GPU<rank>:`.
* torchrun: `python -m torch.distributed.run --standalone --nproc-per-node W --tee 3 --log-dir TMP
  worker.py`, stdout to a file. In torch 2.13 `--tee 3` redirects each worker's stdout/stderr into
  files under the log dir, and one thread per file in the agent tails it (`readline()` in text mode,
  so '\\r' and '\\r\\n' end lines too; 0.1 s sleep at EOF) and writes `[default<rank>]:<line>` to the
  agent's own stdout (stderr lines to its stderr). A line caught half-written is printed as two
  prefixed fragments.

Both outputs are parsed: a line is *whole* when it has the right prefix for its rank and its body
passes the length check; *split/garbled* = every other line; *lost* = expected (rank, seq) pairs never
seen whole; duplicates are counted too.

Times: `wall` is the whole launcher process (torchrun's includes importing torch and its rendezvous);
`log` runs from the moment the first worker starts writing (each worker stamps it) to the launcher's
exit, i.e. the time to get every line out once the job is producing. Throughput = lines / time. The
launchers run interleaved `--repeat` times (default 3) and the best time counts (the median is shown
too): on a shared 2-core machine a neighbour's load easily doubles a single run. Whole / split / lost
counts add up over every run.

    python bench/bench_logmux.py                 # 8 x 100k lines, well under a minute on 2 cores
    python bench/bench_logmux.py --lines 20000   # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = r"""
import os, random, sys, time
rank = int(os.environ["LOCAL_RANK"])
with open(os.path.join(sys.argv[1], "data.%d" % rank), "rb") as fh:
    data = fh.read()
rnd = random.Random(rank)
with open(os.path.join(sys.argv[1], "start.%d" % rank), "w") as fh:
    fh.write(repr(time.time()))
pos = 0
while pos < len(data):  # partial writes: chunk ends fall anywhere inside lines
    step = rnd.randrange(1, 65536)
    os.write(1, data[pos:pos + step])
    pos += step
"""

PODGUARD_DRIVER = r"""
import sys
from podguard.launch.modes import per_gpu_specs
from podguard.launch.run import run_job
from podguard.gpu.selected import Selection
workers, worker, data_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
cpu = Selection(gpus=(), source="none", inventory_count=0)
argv = [sys.executable, worker, data_dir]
specs = per_gpu_specs(argv, cpu, master_port=29500, nproc=workers, prefix_format="GPU{rank}:")
sys.exit(run_job(specs, summary=False).exit_code)
"""

PODGUARD_LINE = re.compile(rb"^GPU(\d+):(w(\d+) (\d+) x* (\d+))$")
TORCHRUN_LINE = re.compile(rb"^\[default(\d+)\]:(w(\d+) (\d+) x* (\d+))$")


def generate(directory: Path, workers: int, lines: int) -> int:
    """Write each rank's bytes to `data.<rank>`; returns the total size."""
    pool = [b"x" * k for k in range(4096)]
    ends = [b"\n"] * 18 + [b"\r", b"\r\n"]
    total = 0
    for rank in range(workers):
        rnd = random.Random(rank)
        parts = []
        for i in range(lines):
            body = b"w%d %d %s" % (rank, i, pool[rnd.randrange(4000) if i % 50 == 0 else rnd.randrange(200)])
            parts.append(body + b" %d" % (len(body) + 1) + ends[i % 20])
        data = b"".join(parts)
        (directory / f"data.{rank}").write_bytes(data)
        total += len(data)
    return total


def count(path: Path, pattern: re.Pattern[bytes], workers: int, lines: int) -> dict[str, int]:
    seen: set[tuple[int, int]] = set()
    whole = bad = dup = 0
    for line in path.read_bytes().split(b"\n")[:-1]:
        m = pattern.match(line)
        if m and m.group(1) == m.group(3) and len(m.group(2)) - len(m.group(5)) == int(m.group(5)):
            key = (int(m.group(3)), int(m.group(4)))
            if key in seen:
                dup += 1
            else:
                seen.add(key)
                whole += 1
        else:
            bad += 1
    return {"whole": whole, "split_or_garbled": bad, "duplicates": dup, "lost": workers * lines - whole}


def run(argv: list[str], out: Path, err: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, epoch seconds at exit)."""
    t0 = time.perf_counter()
    with out.open("wb") as fo, err.open("wb") as fe:
        code = subprocess.run(argv, stdout=fo, stderr=fe, env=env, check=False).returncode
    end = time.time()
    wall = time.perf_counter() - t0
    if code != 0:
        sys.exit(f"{' '.join(argv[:4])} ... exited {code}; see {err}")
    return wall, end


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs per launcher; the best counts")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory with the outputs")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench_logmux."))
    worker = tmp / "worker.py"
    worker.write_text(WORKER)
    size = generate(tmp, args.workers, args.lines)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    launchers = {
        "podguard": ([sys.executable, "-c", PODGUARD_DRIVER, str(args.workers), str(worker), str(tmp)], PODGUARD_LINE),
        "torchrun --tee 3": (
            [
                sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                str(args.workers), "--tee", "3", "--log-dir", str(tmp / "torchrun-logs"), str(worker), str(tmp),
            ],
            TORCHRUN_LINE,
        ),
    }  # fmt: skip
    total = args.workers * args.lines
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in launchers}
    for attempt in range(args.repeat):  # interleaved, so a noisy neighbour hurts both alike
        for name, (argv, pattern) in launchers.items():
            slug = name.split()[0]
            for stamp in tmp.glob("start.*"):
                stamp.unlink()
            out = tmp / f"{slug}.{attempt}.out"
            wall, end = run(argv, out, tmp / f"{slug}.{attempt}.err", env)
            log = end - min(float(p.read_text()) for p in tmp.glob("start.*"))
            counts = count(out, pattern, args.workers, args.lines)
            runs[name].append({"wall_s": wall, "log_s": log, **counts})
            if not args.keep:
                out.unlink()
    results = {}
    for name, rs in runs.items():
        best_log = min(r["log_s"] for r in rs)
        best_wall = min(r["wall_s"] for r in rs)
        results[name] = {
            "runs": len(rs),
            "log_s_best": round(best_log, 3),
            "log_s_median": round(statistics.median(r["log_s"] for r in rs), 3),
            "wall_s_best": round(best_wall, 3),
            "log_lines_per_s": round(total / best_log),
            "lines_per_s": round(total / best_wall),
            # correctness is summed over every run, not just the best one
            "whole": int(sum(r["whole"] for r in rs)),
            "split_or_garbled": int(sum(r["split_or_garbled"] for r in rs)),
            "lost": int(sum(r["lost"] for r in rs)),
            "duplicates": int(sum(r["duplicates"] for r in rs)),
            "expected": total * len(rs),
        }
    pg, tr = results["podguard"], results["torchrun --tee 3"]
    summary = {
        "workers": args.workers,
        "lines_per_worker": args.lines,
        "bytes": size,
        "cpus": os.cpu_count(),
        "results": results,
        "ratio_log_best": round(tr["log_s_best"] / pg["log_s_best"], 2),
        "ratio_log_median": round(tr["log_s_median"] / pg["log_s_median"], 2),
        "ratio_wall_best": round(tr["wall_s_best"] / pg["wall_s_best"], 2),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(
            f"{args.workers} workers x {args.lines:,} lines ({size / 1e6:.0f} MB), {os.cpu_count()} CPUs, "
            f"best of {args.repeat} interleaved runs"
        )
        print(
            f"{'launcher':17} {'log s':>6} {'(median)':>8} {'log lines/s':>12} {'wall s':>7} {'lines/s':>10} "
            f"{'whole':>8} {'split':>6} {'lost':>6} {'dup':>4}"
        )
        for name, r in results.items():
            print(
                f"{name:17} {r['log_s_best']:6.2f} {r['log_s_median']:8.2f} {r['log_lines_per_s']:12,} "
                f"{r['wall_s_best']:7.2f} {r['lines_per_s']:10,} "
                f"{r['whole']:8} {r['split_or_garbled']:6} {r['lost']:6} {r['duplicates']:4}"
            )
        print(
            f"podguard / torchrun: {summary['ratio_log_best']}x log throughput from the first write "
            f"(median {summary['ratio_log_median']}x), {summary['ratio_wall_best']}x whole process"
        )
    if args.keep:
        print(f"outputs kept in {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    ok = pg["split_or_garbled"] == 0 and pg["lost"] == 0 and pg["duplicates"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
