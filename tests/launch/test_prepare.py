"""prepare-once with real processes: one execution across concurrent runs, none after the stamp, nothing
left behind by a SIGKILLed run, node 0 only on shared storage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from containersim import in_container, nolock_env, require_namespaces
from podguard import console
from podguard.errors import UsageError
from podguard.launch.prepare import STAMP_NAME, PrepareError, cache_key, prepare_once
from podguard.launch.prepare_stale import STALE_TEMP_S, TMP_PREFIX, clean_stale, temp_owner
from podguard.state import host_id

DRIVER = """
import json, sys
from podguard.launch.prepare import prepare_once
cache_root, count_file = sys.argv[1], sys.argv[2]
# the sleep comes from the env, so runs with different durations still share one cache key
cmd = ["sh", "-c", f'echo run >> {count_file}; echo partial > "$PODGUARD_PREPARE_DIR/part"; sleep $PREP_SLEEP; '
       'echo "$PODGUARD_PREPARE_KEY" > "$PODGUARD_PREPARE_DIR/data.txt"']
r = prepare_once(cmd, cache_root=cache_root, key_parts={"model": "tiny", "samples": "100"})
print(json.dumps({"hit": r.cache_hit, "by": r.prepared_by, "path": str(r.path), "key": r.key,
                  "waited": r.waited_s, "run": r.run_s}))
"""


def _start(tmp_path: Path, cache: Path, count: Path, sleep_s: float) -> subprocess.Popen[str]:
    driver = tmp_path / "driver.py"
    if not driver.exists():  # rewriting it while an earlier run is still reading it would run an empty file
        driver.write_text(DRIVER)
    return subprocess.Popen(
        [sys.executable, str(driver), str(cache), str(count)],
        env={**os.environ, "PREP_SLEEP": str(sleep_s)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _runs(count: Path) -> int:
    return len(count.read_text().split()) if count.exists() else 0


def test_four_concurrent_runs_prepare_once_then_never_again(tmp_path: Path) -> None:
    cache, count = tmp_path / "cache", tmp_path / "count"
    procs = [_start(tmp_path, cache, count, 0.5) for _ in range(4)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert _runs(count) == 1
    assert sorted(r["hit"] for r in results) == [False, True, True, True]
    assert {r["path"] for r in results} == {results[0]["path"]}
    final = Path(results[0]["path"])
    assert (final / "data.txt").read_text().strip() == results[0]["key"]
    stamp = json.loads((final / STAMP_NAME).read_text())
    assert stamp["key"] == results[0]["key"] and stamp["run_s"] >= 0.5
    assert stamp["key_parts"] == {"model": "tiny", "samples": "100"}
    waiters = [r for r in results if r["hit"]]
    assert all(r["by"] in ("another process", "cache") for r in waiters)
    # after the stamp: a hit without running anything, and nothing left over in the cache root
    again = _start(tmp_path, cache, count, 0.5)
    out, _ = again.communicate(timeout=60)
    assert json.loads(out)["by"] == "cache"
    assert _runs(count) == 1
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [results[0]["key"]]


def test_sigkilled_prepare_leaves_no_stamp_and_the_next_run_succeeds(tmp_path: Path) -> None:
    cache, count = tmp_path / "cache", tmp_path / "count"
    proc = _start(tmp_path, cache, count, 30)
    deadline = time.monotonic() + 20
    while not list(cache.glob(".tmp-*/part")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert list(cache.glob(".tmp-*/part")), "the prepare step never started"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert not list(cache.glob(f"*/{STAMP_NAME}"))
    assert not [p for p in cache.iterdir() if not p.name.startswith(".")]  # no final dir
    # the step itself died with its parent (parent-death signal), so it is not still writing
    time.sleep(0.2)
    assert _runs(count) == 1

    nxt = _start(tmp_path, cache, count, 0)
    out, err = nxt.communicate(timeout=60)
    assert nxt.returncode == 0, err
    result = json.loads(out)
    assert result["hit"] is False
    assert _runs(count) == 2
    assert (Path(result["path"]) / STAMP_NAME).exists()
    assert not list(cache.glob(".tmp-*")), "the killed run's temp dir was not cleaned"


def test_half_renamed_result_without_stamp_is_redone(tmp_path: Path) -> None:
    calls: list[Path] = []

    def build(out: Path) -> None:
        calls.append(out)
        (out / "x").write_text("ok")

    key = cache_key(build, {"a": "1"})
    (tmp_path / key).mkdir()  # as if killed between the rename and the stamp
    (tmp_path / key / "junk").write_text("half")
    result = prepare_once(build, cache_root=tmp_path, key_parts={"a": "1"})
    assert not result.cache_hit and len(calls) == 1
    assert not (result.path / "junk").exists() and (result.path / "x").read_text() == "ok"


def test_callable_command_and_key_rules(tmp_path: Path) -> None:
    seen: list[Path] = []

    def build(out: Path) -> None:
        seen.append(out)
        (out / "f").write_text("1")

    first = prepare_once(build, cache_root=tmp_path, key_parts={"b": 2, "a": "x"})
    assert not first.cache_hit and first.prepared_by == "this process" and first.run_s >= 0
    assert seen[0] != first.path  # written in a temp dir, then renamed
    # same parts in another order: same key, a hit
    second = prepare_once(build, cache_root=tmp_path, key_parts={"a": "x", "b": 2})
    assert second.cache_hit and second.key == first.key and len(seen) == 1
    # any changed part, or a different command, is a new key
    assert cache_key(build, {"a": "x", "b": 3}) != first.key
    assert cache_key(build, {"a": "x", "b": "2"}) != first.key  # 2 and "2" differ
    assert cache_key(["echo", "1"], {"a": "x"}) != cache_key(["echo", "2"], {"a": "x"})


def test_failing_command_caches_nothing_and_reports_its_code(tmp_path: Path) -> None:
    with console.captured() as lines, pytest.raises(PrepareError, match="exited 5") as info:
        prepare_once(["sh", "-c", "touch $PODGUARD_PREPARE_DIR/x; exit 5"], cache_root=tmp_path, key_parts={})
    assert info.value.code == 5
    assert list(tmp_path.iterdir()) == [p for p in tmp_path.iterdir() if p.name.endswith(".lock")]
    assert any("running" in line for line in lines)


def test_failing_callable_cleans_its_temp_dir(tmp_path: Path) -> None:
    def boom(out: Path) -> None:
        (out / "x").write_text("1")
        raise RuntimeError("tokenizer download failed")

    with pytest.raises(RuntimeError, match="tokenizer"):
        prepare_once(boom, cache_root=tmp_path, key_parts={})
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_env_reaches_the_command(tmp_path: Path) -> None:
    cmd = ["sh", "-c", 'echo "$TOKENIZER" > "$PODGUARD_PREPARE_DIR/tok"']
    result = prepare_once(cmd, cache_root=tmp_path, key_parts={}, env={"TOKENIZER": "gpt2"})
    assert (result.path / "tok").read_text().strip() == "gpt2"


def test_shared_storage_only_node0_prepares(tmp_path: Path) -> None:
    calls: list[int] = []
    results = {}

    def build(out: Path) -> None:
        calls.append(1)
        time.sleep(0.3)
        (out / "d").write_text("x")

    def node(n: int) -> None:
        results[n] = prepare_once(
            build,
            cache_root=tmp_path,
            key_parts={"k": "v"},
            shared_storage=True,
            node_rank=n,
            wait_timeout_s=20,
            progress_every_s=0.1,
        )

    with console.captured() as lines:  # (the followers' threads too)
        followers = [threading.Thread(target=node, args=(n,)) for n in (1, 2)]
        for t in followers:
            t.start()
        time.sleep(0.1)
        node(0)
        for t in followers:
            t.join(timeout=20)
    assert len(calls) == 1
    assert not results[0].cache_hit
    assert results[1].cache_hit and results[1].prepared_by == "node 0" and results[1].waited_s > 0.2
    assert any("waits for node 0" in line for line in lines)
    assert any("still waiting for node 0" in line for line in lines)


def test_shared_storage_follower_times_out_with_75(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(PrepareError, match="no stamp appeared") as info:
        prepare_once(
            ["true"],
            cache_root=tmp_path,
            key_parts={},
            shared_storage=True,
            node_rank=1,
            wait_timeout_s=0.3,
        )
    assert info.value.code == 75
    assert time.monotonic() - start < 2


def test_node_rank_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_RANK", "1")
    with pytest.raises(PrepareError):
        prepare_once(
            ["true"],
            cache_root=tmp_path,
            key_parts={},
            shared_storage=True,
            wait_timeout_s=0.1,
        )
    # not shared: every node prepares its own
    result = prepare_once(["true"], cache_root=tmp_path, key_parts={})
    assert not result.cache_hit
    monkeypatch.setenv("NODE_RANK", "one")
    with pytest.raises(UsageError, match="NODE_RANK"):
        prepare_once(["false"], cache_root=tmp_path / "o", key_parts={}, shared_storage=True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"command": "echo hi"}, "argument list"),
        ({"command": []}, "non-empty list"),
        ({"key_parts": {"": "x"}}, "key part name"),
        ({"key_parts": {"a": [1]}}, "string or number"),
        ({"wait_timeout_s": 0}, "wait timeout"),
        ({"command": ["no-such-prepare-program-xyz"]}, "not found"),
    ],
)
def test_bad_input_is_a_usage_error(tmp_path: Path, kwargs: dict, message: str) -> None:
    args = {"command": ["true"], "cache_root": tmp_path, "key_parts": {}}
    args.update(kwargs)
    with pytest.raises(UsageError, match=message):
        prepare_once(**args)


def test_unwritable_cache_root_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="cannot be created"):
        prepare_once(["true"], cache_root=blocker / "sub", key_parts={})


def test_waiters_report_progress(tmp_path: Path) -> None:
    """A second process waiting on the lock says so (and does not spin silently)."""
    cache, count = tmp_path / "cache", tmp_path / "count"
    first = _start(tmp_path, cache, count, 0.6)
    deadline = time.monotonic() + 20
    while not list(cache.glob(".tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.01)
    cmd = ["sh", "-c", f'echo run >> {count}; echo partial > "$PODGUARD_PREPARE_DIR/part"; sleep $PREP_SLEEP; '
           'echo "$PODGUARD_PREPARE_KEY" > "$PODGUARD_PREPARE_DIR/data.txt"']  # fmt: skip
    with console.captured() as lines:
        result = prepare_once(
            cmd, cache_root=cache, key_parts={"model": "tiny", "samples": "100"}, progress_every_s=0.1
        )
    first.communicate(timeout=30)
    assert result.cache_hit and result.prepared_by == "another process" and result.waited_s > 0.1
    assert any("another process is preparing" in line for line in lines)
    assert _runs(count) == 1
    assert os.path.exists(result.path / "data.txt")


# --------------------------------------------------------------------------------------------------
# network volumes (issue 7 item 11): pods share the cache, not their locks nor their PIDs


def test_temp_folders_are_named_per_host_not_by_pid_alone(tmp_path: Path) -> None:
    seen: list[str] = []
    prepare_once(lambda out: seen.append(out.name), cache_root=tmp_path, key_parts={})
    owner = temp_owner(seen[0], TMP_PREFIX, seen[0][len(TMP_PREFIX) :].split("-")[0])
    assert owner == (host_id(), os.getpid())
    assert seen[0].rsplit("-", 1)[1]  # plus a random part: two pods' PID 1 still differ


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_stale_cleaning_keeps_what_another_pod_may_still_be_writing(tmp_path: Path) -> None:
    key = "k" * 24
    made = {
        "mine, process gone": f"{TMP_PREFIX}{key}-{host_id()}-{_dead_pid()}-aaaa",
        "mine, process alive": f"{TMP_PREFIX}{key}-{host_id()}-{os.getpid()}-bbbb",
        "other pod, fresh": f"{TMP_PREFIX}{key}-other-pod-1-cccc",
        "other pod, abandoned": f"{TMP_PREFIX}{key}-other-pod-1-dddd",
        "older naming, fresh": f"{TMP_PREFIX}{key}-1234",
    }
    for name in made.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "part").write_text("x")
    old = time.time() - STALE_TEMP_S - 60
    for path in (tmp_path / made["other pod, abandoned"], tmp_path / made["other pod, abandoned"] / "part"):
        os.utime(path, (old, old))
    with console.captured() as lines:
        clean_stale(tmp_path, key, has_stamp=lambda folder: False)
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {made["mine, process alive"], made["other pod, fresh"], made["older naming, fresh"]}
    assert any("interrupted run on this host" in line for line in lines)
    assert any("untouched for 24 h" in line for line in lines)


def test_an_unstamped_result_is_checked_again_before_it_is_deleted(tmp_path: Path) -> None:
    key = "k" * 24
    final = tmp_path / key
    final.mkdir()
    (final / "data").write_text("complete")
    checks: list[Path] = []

    def stamp_lands_meanwhile(folder: Path) -> bool:  # another pod's (older podguard's) stamp arrives
        checks.append(folder)
        return len(checks) > 1

    clean_stale(tmp_path, key, has_stamp=stamp_lands_meanwhile)
    assert (final / "data").read_text() == "complete" and len(checks) == 2
    assert [p.name for p in tmp_path.iterdir()] == [key]  # put back; no trash left
    clean_stale(tmp_path, key, has_stamp=lambda folder: False)
    assert list(tmp_path.iterdir()) == []


POD_DRIVER = """
import json, sys
from podguard.launch.prepare import prepare_once
cache, count = sys.argv[1], sys.argv[2]
# both pods are inside the step at the same time (a barrier in the shared folder), then both finish
step = (f'echo run >> {count}; hostname > {count}.$(hostname); i=0; '
        f'while [ $(ls {count}.* | wc -l) -lt 2 ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; '
        'echo "$PODGUARD_PREPARE_KEY" > "$PODGUARD_PREPARE_DIR/data.txt"')
cmd = ["sh", "-c", step]
r = prepare_once(cmd, cache_root=cache, key_parts={"dataset": "d"})
print(json.dumps({"by": r.prepared_by, "key": r.key, "path": str(r.path)}))
"""


def test_two_pods_on_a_volume_without_flock_publish_one_complete_result(tmp_path: Path) -> None:
    """ENOLCK (NFS without a lock daemon) is no traceback, and the two pods' temp folders (both made by a
    PID 1) neither collide nor get deleted by the other pod; the first rename wins, the other uses it."""
    require_namespaces()
    cache, count = tmp_path / "cache", tmp_path / "count"
    cache.mkdir()
    env = {**os.environ, **nolock_env(cache)}
    procs = []
    for pod in ("pod-a", "pod-b"):
        (tmp_path / pod).mkdir()  # each pod's own /tmp (host-local)
        argv = in_container([sys.executable, "-c", POD_DRIVER, str(cache), str(count)], hostname=pod)
        pod_env = {**env, "TMPDIR": str(tmp_path / pod)}
        procs.append(subprocess.Popen(argv, env=pod_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "Traceback" not in err, err
        assert "has no file locks" in err
        results.append(json.loads(out))
    assert _runs(count) == 2  # no lock across pods: both ran ...
    assert sorted(r["by"] for r in results) == ["another host", "this process"]  # ... one result counts
    final = Path(results[0]["path"])
    assert (final / "data.txt").read_text().strip() == results[0]["key"]
    assert json.loads((final / STAMP_NAME).read_text())["host"] in ("pod-a", "pod-b")
    assert [p.name for p in cache.iterdir() if not p.name.endswith((".lock", ".flock-probe"))] == [final.name]
