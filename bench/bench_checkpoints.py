"""What finding the checkpoint to resume from costs, and how much work a `--save-signal` saves (issue 25).

    python bench/bench_checkpoints.py [--quick]

1. The finder on 1,000 Hugging Face `checkpoint-<N>/` folders laid out as a real Trainer writes them: a 100 MB
   `model.safetensors` (sparse: a real header naming 148 tensors, then a hole), config.json,
   generation_config.json, an AdamW `optimizer.pt` (444 zip records), scheduler.pt, rng_state.pth,
   training_args.bin and a `trainer_state.json` with a log entry every 10 steps (889 MB of them in all): 101 GB.
   `find_checkpoints` judging all of them (median of 3, page cache warm, as on a restart) and the bytes it read
   (/proc/self/io); a restart (newest first until the first whole one) and a save-wait poll (only the new);
   `podguard checkpoints DIR` and `--json` as whole processes (median of 3).
2. The finder on 100 torch DCP folders (148 parameters with their AdamW state: `.metadata` is unpickled, inertly).
3. One 2 GB safetensors file (sparse): judged from its header alone (time and bytes read), whole and cut short.
4. Work lost when `--max-runtime` ends the demo job (2 gloo ranks, `--save-every 500`), with and without
   `--save-signal USR1`: the steps the next run redoes = the last step done - the step it resumes from.
   `--quick` skips it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import PODGUARD, ROOT, compile_bytecode, fake_node, node_env, time_process

sys.path.insert(0, str(ROOT / "entrypoint"))

from podguard.checkpoints import find_checkpoints
from podguard.checkpoints.files import safetensors_why

CHECKPOINTS = 1000
EACH = 100 * 1000 * 1000  # bytes per model.safetensors (sparse)
LOG_EVERY = 10  # steps between two log_history entries (HF's logging_steps), checkpoints every 100 steps
TENSORS = 148  # GPT-2's parameter count: safetensors header entries, optimizer.pt records (x3)


def sparse_safetensors(path: Path, total: int, tensors: int = 1) -> None:
    """A valid safetensors file of `total` bytes: `tensors` uint8 tensors filling the data, written as a hole."""
    n_guess = 128 + 112 * tensors
    data = total - 8 - n_guess
    each = data // tensors
    spans = [(i * each, data if i == tensors - 1 else (i + 1) * each) for i in range(tensors)]
    layers = {
        f"transformer.h.{i}.weight": {"dtype": "U8", "shape": [e - b], "data_offsets": [b, e]}
        for i, (b, e) in enumerate(spans)
    }
    header = json.dumps(layers).encode()
    assert len(header) <= n_guess
    header = header.ljust(n_guess, b" ")  # the spec allows trailing spaces in the header
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(total)


def _rchar() -> int:
    with open("/proc/self/io", "rb", buffering=0) as f:
        return int(f.read().split(b"rchar:")[1].split()[0])


_first = _rchar()
PROBE_COST = _rchar() - _first  # what reading /proc/self/io itself adds to rchar


def read_bytes() -> int:
    """Bytes this process has read so far (rchar), less the cost of asking."""
    return _rchar() - PROBE_COST


def hf_template(root: Path, tensors: int) -> dict[str, bytes]:
    """The files a real Trainer writes beside the weights (transformers `_save_checkpoint`), once: an AdamW state
    for `tensors` parameters (torch.save: one zip record per tensor, as in a real model's optimizer.pt), the
    scheduler, the RNG states and the training arguments. Small tensors: the zip's directory is what is judged."""
    import torch  # lazy: only the benchmark writes torch files

    params = [torch.nn.Parameter(torch.zeros(4)) for _ in range(tensors)]
    optim = torch.optim.AdamW(params)
    for p in params:
        p.grad = torch.ones(4)
    optim.step()
    files = {
        "optimizer.pt": optim.state_dict(),
        "scheduler.pt": {"last_epoch": 1, "_step_count": 2, "base_lrs": [5e-5]},
        "rng_state.pth": {"python": 1, "numpy": 2, "cpu": torch.get_rng_state()},
        "training_args.bin": {"output_dir": str(root), "save_steps": 100},
    }
    out = {}
    for name, obj in files.items():
        torch.save(obj, root / name)
        out[name] = (root / name).read_bytes()
        (root / name).unlink()
    return out


def trainer_state(step: int, log_every: int, entries: list[str]) -> str:
    """trainer_state.json as `TrainerState.save_to_json` writes it (indent=2, sorted keys), with one log entry
    per `log_every` steps up to `step` (its log_history is what makes a long run's file megabytes)."""
    head = {
        "best_global_step": None,
        "best_metric": None,
        "best_model_checkpoint": None,
        "epoch": step / 1e5,
        "eval_steps": 500,
        "global_step": step,
        "is_hyper_param_search": False,
        "is_local_process_zero": True,
        "is_world_process_zero": True,
        "log_history": [],
        "logging_steps": log_every,
        "max_steps": 100_000,
        "num_input_tokens_seen": 0,
        "num_train_epochs": 1,
        "save_steps": 100,
        "stateful_callbacks": {},
        "total_flos": 1.0e15,
        "train_batch_size": 8,
        "trial_name": None,
        "trial_params": None,
    }
    text = json.dumps(head, indent=2, sort_keys=True) + "\n"
    count = step // log_every
    if count:
        text = text.replace('"log_history": []', '"log_history": [\n' + ",\n".join(entries[:count]) + "\n  ]")
    return text


def log_entries(n: int, log_every: int) -> list[str]:
    out = []
    for i in range(1, n + 1):
        entry = {
            "epoch": i * log_every / 1e5,
            "grad_norm": 1.0 / i,
            "learning_rate": 5e-5 * (1 - i / (n + 1)),
            "loss": 2.0 + 1.0 / i,
            "step": i * log_every,
        }
        out.append("\n".join("    " + line for line in json.dumps(entry, indent=2, sort_keys=True).splitlines()))
    return out


def hf_checkpoints(root: Path, count: int, log_every: int, tensors: int) -> None:
    """`count` checkpoint-<N>/ folders (every 100 steps) as a real Trainer lays them out: a 100 MB
    model.safetensors (a real header naming `tensors` tensors, then a hole), config.json,
    generation_config.json, optimizer.pt, scheduler.pt, rng_state.pth, training_args.bin, trainer_state.json."""
    template = hf_template(root, tensors)
    entries = log_entries(count * 100 // log_every, log_every)
    for i in range(1, count + 1):
        step = i * 100
        folder = root / f"checkpoint-{step}"
        folder.mkdir()
        sparse_safetensors(folder / "model.safetensors", EACH, tensors)
        (folder / "config.json").write_text('{"model_type": "gpt2"}')
        (folder / "generation_config.json").write_text("{}")
        for name, data in template.items():
            (folder / name).write_bytes(data)
        (folder / "trainer_state.json").write_text(trainer_state(step, log_every, entries))


def timed(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def finder(root: Path, log_every: int, tensors: int) -> None:
    hf_checkpoints(root, CHECKPOINTS, log_every, tensors)
    files = [p for p in root.rglob("*") if p.is_file()]
    logical = sum(p.stat().st_size for p in files)
    on_disk = sum(p.stat().st_blocks * 512 for p in files)
    state = sum((root / f"checkpoint-{i * 100}" / "trainer_state.json").stat().st_size for i in range(1, 1001))
    print(f"1. finder: {CHECKPOINTS} HF checkpoints, {logical / 1e9:.0f} GB logical ({on_disk / 1e6:.0f} MB on disk;")
    print(f"   trainer_state.json {state / 1e6:.0f} MB in all: a log entry every {log_every} steps; {tensors} tensors)")
    finding = find_checkpoints(root)
    assert finding.chosen is not None and finding.chosen.step == CHECKPOINTS * 100, finding.chosen
    assert len(finding.checkpoints) == CHECKPOINTS and all(c.whole for c in finding.checkpoints)
    before = read_bytes()
    find_checkpoints(root)
    got = read_bytes() - before
    times = timed(lambda: find_checkpoints(root), 3)
    print(
        f"   judging all (find_checkpoints): median {statistics.median(times) * 1000:.0f} ms, "
        f"{got / 1e6:.1f} MB read ({got / CHECKPOINTS / 1000:.1f} KB per checkpoint)"
    )
    before = read_bytes()
    find_checkpoints(root, until_whole=True)
    got = read_bytes() - before
    times = timed(lambda: find_checkpoints(root, until_whole=True), 5)
    print(
        f"   before an attempt (the newest whole one): median {statistics.median(times) * 1000:.0f} ms, "
        f"{got / 1000:.0f} KB read"
    )
    times = timed(lambda: find_checkpoints(root, until_whole=True, skip=finding.keys), 5)
    print(f"   a save-wait poll (only the new): median {statistics.median(times) * 1000:.0f} ms")
    compile_bytecode()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "entrypoint")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for extra in ([], ["--json"]):
        argv = [*PODGUARD, "checkpoints", str(root), *extra]
        times = [time_process(argv, env) for _ in range(3)]
        print(
            f"   `podguard checkpoints DIR {' '.join(extra)}`: median {statistics.median(times):.2f} s (whole process)"
        )


def dcp_checkpoints(root: Path, count: int, tensors: int) -> None:
    """`count` torch DCP folders (`step_<N>/`), each a real `dcp.save` of `tensors` parameters with their AdamW
    state through `get_state_dict` (3 x `tensors` items in `.metadata`): the finder judging all, and one."""
    import warnings

    import torch  # lazy: only the benchmark writes torch files
    import torch.distributed.checkpoint as dcp  # lazy: as above
    from torch.distributed.checkpoint.state_dict import get_state_dict  # lazy: as above

    params = [torch.nn.Parameter(torch.zeros(4)) for _ in range(tensors)]
    model = torch.nn.ParameterList(params)
    optim = torch.optim.AdamW(model.parameters())
    for p in params:
        p.grad = torch.ones(4)
    optim.step()
    model_state, optim_state = get_state_dict(model, optim)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (no process group: DCP says it saves in a single process)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(root / "step_100"))
    template = {p.name: p.read_bytes() for p in (root / "step_100").iterdir()}
    for i in range(2, count + 1):
        folder = root / f"step_{i * 100}"
        folder.mkdir()
        for name, data in template.items():
            (folder / name).write_bytes(data)
    meta = len(template[".metadata"])
    finding = find_checkpoints(root)
    assert len(finding.checkpoints) == count and all(c.whole for c in finding.checkpoints)
    times = timed(lambda: find_checkpoints(root), 3)
    one = timed(lambda: find_checkpoints(root, until_whole=True), 5)
    print(f"2. finder: {count} torch DCP checkpoints ({tensors} tensors and their AdamW state: a {meta / 1000:.0f} KB")
    print(
        f"   .metadata each): judging all median {statistics.median(times) * 1000:.0f} ms "
        f"({statistics.median(times) / count * 1000:.1f} ms each); the newest whole one "
        f"{statistics.median(one) * 1000:.0f} ms"
    )


def big_file(root: Path) -> None:
    path = root / "model-2gb.safetensors"
    sparse_safetensors(path, 2 * 1000**3)
    before = read_bytes()
    t0 = time.perf_counter()
    why = safetensors_why(str(path))
    took = time.perf_counter() - t0
    got = read_bytes() - before
    print(f"3. 2 GB safetensors: whole={why == ''} in {took * 1e6:.0f} us, {got} bytes read")
    with open(path, "r+b") as f:
        f.truncate(1_200_000_000)
    t0 = time.perf_counter()
    why = safetensors_why(str(path))
    print(f"   cut to 1.2 GB: {why!r} in {(time.perf_counter() - t0) * 1e6:.0f} us")


DEMO = ["-m", "podguard.demo", "--preset", "ci", "--steps", "100000000", "--save-every", "500", "--log-every", "1"]


def lost_steps(env: dict[str, str], root: Path, save_signal: bool, runtime_s: float) -> tuple[int, int, str]:
    """(last step done, step the next run resumes from, the guard's line) for one --max-runtime stop."""
    ckpt = root / ("with" if save_signal else "without")
    args = [
        "train",
        "--mode",
        "per-gpu",
        "--cpu-workers",
        "2",
        "--checkpoints",
        str(ckpt),
        "--max-runtime",
        f"{runtime_s}s",
    ]
    if save_signal:
        args += ["--save-signal", "USR1"]
    proc = subprocess.run(
        [*PODGUARD, *args, "--", sys.executable, *DEMO], env=env, capture_output=True, text=True, timeout=300
    )
    text = proc.stdout + proc.stderr
    if proc.returncode != 124:
        raise SystemExit(f"expected 124, got {proc.returncode}:\n{text[-3000:]}")
    done = max(int(m) for m in re.findall(r"\[rank 0\] step (\d+)/", text))
    resumed = find_checkpoints(ckpt).chosen
    if resumed is not None and resumed.step is not None:
        done = max(done, resumed.step)  # (the step saved on the signal stops the loop before its progress line)
    guard = next(ln for ln in text.splitlines() if "not inside a RunPod pod" in ln)
    return done, resumed.step if resumed is not None and resumed.step is not None else 0, guard


def main() -> None:
    quick = "--quick" in sys.argv
    root = Path(tempfile.mkdtemp(prefix="podguard-bench-ckpt-"))
    try:
        (root / "many").mkdir()
        finder(root / "many", LOG_EVERY, TENSORS)
        (root / "dcp").mkdir()
        dcp_checkpoints(root / "dcp", 100, TENSORS)
        big_file(root)
        if quick:
            return
        node = fake_node()
        try:
            env = node_env(node, LD_LIBRARY_PATH="")
            print("4. work lost on a --max-runtime stop (demo job, 2 gloo ranks, --save-every 500):")
            for save in (False, True):
                done, resumed, guard = lost_steps(env, root, save, 12.0)
                label = "with --save-signal USR1" if save else "without --save-signal  "
                print(f"   {label}: last step {done}, the next run resumes at {resumed}: {done - resumed} steps redone")
                print(f"      {guard.removeprefix('podguard: ')}")
        finally:
            node.teardown()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    os.environ.pop("PODGUARD_RESUME_FROM", None)
    main()
