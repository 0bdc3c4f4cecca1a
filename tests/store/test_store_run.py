"""`podguard run --checkpoints DIR --checkpoint-store URL` end to end, as users run it: a real job saving
checkpoints, a real S3 server (moto's, on loopback) or a folder, and a second "pod" (another, empty DIR) that
comes back from the store."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from s3server import S3Server, store_env
from storejobs import job_argv

from jobproc import run_podguard

pytestmark = pytest.mark.slow


def podguard(node, args, *, store: str, env=None, timeout=120.0):
    full = {**store_env(store), **(env or {})}
    proc = run_podguard(node, args, env=full, cpu=True, timeout=timeout)
    return proc, proc.stdout + proc.stderr


def test_bad_store_input_is_64_before_the_job_starts_naming_the_url_and_the_credential_source(cli_node, tmp_path, s3):
    server, bucket = s3
    marker = tmp_path / "ran"
    job = ["--", "sh", "-c", f"touch {marker}"]
    d = str(tmp_path / "ckpt")
    cases = [
        (["--checkpoint-store", "gs://b/run1"], {}, "--checkpoint-store='gs://b/run1' has scheme 'gs://'"),
        (["--checkpoint-store", "s3://no-such-bucket/run1"], {}, "the bucket 'no-such-bucket' does not exist"),
        (["--checkpoint-store", f"s3://{bucket}/run1", "--store-keep", "0"], {}, "--store-keep=0 is not valid"),
        (["--checkpoint-store", f"file://{tmp_path / 'x'}"], None, "needs --checkpoints DIR"),
    ]
    for extra, env, expected in cases:
        args = ["run", "--checkpoints", d, *extra, *job] if env is not None else ["run", *extra, *job]
        proc, text = podguard(cli_node, args, store=server.url, env=env)
        assert proc.returncode == 64, text
        assert expected in text, text
        assert not marker.exists()

    refusing = S3Server.start({"INITIAL_NO_AUTH_ACTION_COUNT": "0"})  # moto checks credentials: ours are unknown
    try:
        args = ["run", "--checkpoints", d, "--checkpoint-store", "s3://ckpt-refused/run1", *job]
        proc, text = podguard(cli_node, args, store=refusing.url)
    finally:
        refusing.stop()
    assert proc.returncode == 64, text
    line = next(line for line in text.splitlines() if "s3://ckpt-refused/run1" in line)
    assert "refused the credentials" in line
    assert f"(endpoint {refusing.url}; credentials from the environment (AWS_ACCESS_KEY_ID/" in line
    assert "AWS_SECRET_ACCESS_KEY), key …0001)" in line
    assert "podguard-test-secret-value" not in text  # never the secret
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["s3", "file"])
def test_a_new_pod_with_an_empty_dir_comes_back_from_the_store(cli_node, tmp_path, s3, kind):
    server, bucket = s3
    url = f"s3://{bucket}/run1" if kind == "s3" else f"file://{tmp_path / 'store'}"
    pod1, pod2 = tmp_path / "pod1", tmp_path / "pod2"
    args = ["run", "--checkpoints", str(pod1), "--checkpoint-store", url, "--"]
    proc, text = podguard(cli_node, [*args, *job_argv(tmp_path, steps=6, every=3)], store=server.url)
    assert proc.returncode == 0, text
    assert re.search(
        rf"podguard: stored step-6\.pt in {re.escape(url)} \([\d.]+ [KM]?B in [\d.]+ s, [\d.]+ [KMG]?B/s\)$", text, re.M
    ), text
    end = next(line for line in text.splitlines() if " END " in line)
    assert re.search(rf"; stored step-6\.pt \(step 6, written \d{{4}}-\d\d-\d\dT[\d:]+Z\) in {re.escape(url)}", end)
    assert len(end) < 400

    # another pod: the same store, an empty (missing) DIR
    args2 = ["run", "--checkpoints", str(pod2), "--checkpoint-store", url, "--"]
    proc, text = podguard(cli_node, [*args2, *job_argv(tmp_path, steps=9, every=3)], store=server.url)
    assert proc.returncode == 0, text
    assert re.search(rf"podguard: restored step-6\.pt \(step 6\) from {re.escape(url)}: [\d.]+ [KM]?B in ", text), text
    assert f"podguard: resuming from {pod2 / 'step-6.pt'} (step 6, written " in text
    assert "resumed from step 6 (step-6.pt)" in text
    assert (pod2 / "step-6.pt").read_bytes() == (pod1 / "step-6.pt").read_bytes()
    assert not [p for p in pod2.iterdir() if p.name.startswith(".podguard")]
    assert "podguard: stored step-9.pt in" in text


def test_the_newest_wins_both_ways(cli_node, tmp_path, s3):
    """A local checkpoint newer than the store's is used as it is; a store's newer than DIR's is restored."""
    server, bucket = s3
    url = f"s3://{bucket}/run1"
    pod1, pod2 = tmp_path / "pod1", tmp_path / "pod2"
    run = lambda pod, steps: podguard(  # noqa: E731
        cli_node,
        ["run", "--checkpoints", str(pod), "--checkpoint-store", url, "--", *job_argv(tmp_path, steps=steps, every=2)],
        store=server.url,
    )
    proc, text = run(pod1, 4)  # the store: step-4.pt
    assert proc.returncode == 0, text
    proc, text = run(pod2, 8)  # pod2 restores step 4, trains to 8; the store: step-8 (and step-6: --store-keep 2)
    assert proc.returncode == 0 and "restored step-4.pt (step 4)" in text, text
    # pod1 again: its own newest (step 4) is older than the store's (step 8): the store's comes
    proc, text = run(pod1, 10)
    assert proc.returncode == 0, text
    assert "restored step-8.pt (step 8)" in text and "resumed from step 8 (step-8.pt)" in text, text
    # pod2 again, its DIR now newer than the store? no: the store has step 10 from pod1; make pod2 newer locally
    (pod2 / "step-12.pt").write_bytes((pod1 / "step-10.pt").read_bytes())  # a local save the store never saw
    proc, text = run(pod2, 12)
    assert proc.returncode == 0, text
    assert "restored" not in text and f"resuming from {pod2 / 'step-12.pt'}" in text, text


@pytest.mark.parametrize("outage", ["dropped", "502"])
def test_the_store_going_away_mid_run_neither_fails_nor_slows_the_job_and_it_catches_up(cli_node, tmp_path, s3, outage):
    from s3server import Relay

    server, bucket = s3
    relay = Relay(server.port)
    url = f"s3://{bucket}/run1"
    pod = tmp_path / "pod"
    log = tmp_path / "out.txt"
    import subprocess
    import sys

    env = {**cli_node.env, **store_env(relay.url), "LD_LIBRARY_PATH": ""}
    argv = ["run", "--checkpoints", str(pod), "--checkpoint-store", url, "--"]
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "podguard", *argv, *job_argv(tmp_path, steps=60, every=5, step_s=0.1)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            _wait_for(log, "podguard: stored step-", 60)
            if outage == "502":
                relay.bad_gateway()  # the store answers 502 Bad Gateway to every request
            else:
                relay.down()  # the store goes away: connections dropped, new ones closed at once
            _wait_for(log, "warning: cannot store", 60)
            relay.up()  # and comes back
            code = proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.kill()
            relay.close()
    text = log.read_text()
    assert code == 0, text
    assert text.count("warning: cannot store") == 1, text  # one warning per outage
    assert "step 60" in text and "done" in text
    assert "podguard: stored step-60.pt" in text, text  # it caught up: the last one is in the store
    steps = [int(m) for m in re.findall(r"^step (\d+)$", text, re.MULTILINE)]
    assert steps == list(range(1, 61))


def _wait_for(path: Path, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while needle not in path.read_text():
        assert time.monotonic() < deadline, f"no {needle!r} in:\n{path.read_text()[-3000:]}"
        time.sleep(0.05)


def test_the_save_before_a_guard_stops_the_job_waits_for_its_upload(cli_node, tmp_path, s3):
    server, bucket = s3
    url = f"s3://{bucket}/run1"
    pod = tmp_path / "pod"
    args = ["run", "--checkpoints", str(pod), "--checkpoint-store", url, "--save-signal", "USR1"]
    args += ["--max-runtime", "4s", "--save-grace", "60s", "--"]
    proc, text = podguard(
        cli_node, [*args, *job_argv(tmp_path, steps=100000, every=100000, step_s=0.05)], store=server.url
    )
    assert proc.returncode == 124, text
    m = re.search(
        rf"saved checkpoint {re.escape(str(pod))}/step-(\d+)\.pt \(step \d+\) in [\d.]+s; stored in {re.escape(url)}",
        text,
    )
    assert m is not None, text
    keys = server.keys(bucket, "run1/")
    assert f"run1/step-{m.group(1)}.pt.podguard-manifest.json" in keys, keys


def test_the_metrics_show_the_store(cli_node, tmp_path, s3):
    server, bucket = s3
    url = f"s3://{bucket}/run1"
    prom = tmp_path / "m.prom"
    args = ["run", "--checkpoints", str(tmp_path / "pod"), "--checkpoint-store", url, "--metrics-file", str(prom), "--"]
    proc, text = podguard(cli_node, [*args, *job_argv(tmp_path, steps=6, every=3, size=10000)], store=server.url,
                          env={"PODGUARD_METRICS_INTERVAL": "0.2"})  # fmt: skip
    assert proc.returncode == 0, text
    metrics = prom.read_text()
    assert "podguard_store_checkpoint_step 6.0" in metrics, metrics
    assert "podguard_store_lag_seconds 0.0" in metrics
    ok = float(re.search(r'^podguard_store_uploads_total\{result="ok"\} (\S+)$', metrics, re.MULTILINE).group(1))
    assert ok >= 1  # (step 3's upload, unless step 6 came before the mirror's first look)
    assert 'podguard_store_uploads_total{result="failed"} 0.0' in metrics
    sent = float(re.search(r"^podguard_store_uploaded_bytes_total (\S+)$", metrics, re.MULTILINE).group(1))
    assert sent >= ok * 10000 * 4
    assert "# TYPE podguard_store_uploaded_bytes_total counter" in metrics
    assert "podguard-test-secret" not in metrics


def test_the_end_lines_store_fragment_reads_back_for_pod_keep(cli_node, tmp_path, s3):
    from podguard.outcome_lines import END_LINE, newest_checkpoint, stored_checkpoint

    server, bucket = s3
    url = f"s3://{bucket}/run1"
    args = ["run", "--checkpoints", str(tmp_path / "pod"), "--checkpoint-store", url, "--"]
    proc, text = podguard(cli_node, [*args, *job_argv(tmp_path, steps=3, every=3)], store=server.url)
    assert proc.returncode == 0, text
    end = next(line for line in text.splitlines() if END_LINE.match(line))
    local, stored = newest_checkpoint(end), stored_checkpoint(end)
    assert local is not None and local.path == str(tmp_path / "pod" / "step-3.pt") and local.step == 3
    assert stored is not None and stored.path == f"{url}/step-3.pt" and stored.step == 3
    assert abs(stored.written - local.written) < 1


@pytest.mark.parametrize("kind", ["s3", "file"])
def test_a_restore_that_fails_leaves_nothing_behind_and_falls_back(cli_node, tmp_path, s3, kind):
    """The store's copy of a file is damaged (same size, other bytes): its CRC-32 does not match the manifest."""
    server, bucket = s3
    url = f"s3://{bucket}/run1" if kind == "s3" else f"file://{tmp_path / 'store'}"
    pod1, pod2 = tmp_path / "pod1", tmp_path / "pod2"
    args = ["run", "--checkpoints", str(pod1), "--checkpoint-store", url, "--"]
    proc, text = podguard(cli_node, [*args, *job_argv(tmp_path, steps=3, every=3)], store=server.url)
    assert proc.returncode == 0 and "stored step-3.pt" in text, text
    damaged = bytes(b ^ 0xFF for b in (pod1 / "step-3.pt").read_bytes())
    if kind == "s3":
        server.client().put_object(Bucket=bucket, Key="run1/step-3.pt", Body=damaged)
    else:
        (tmp_path / "store" / "step-3.pt").write_bytes(damaged)
    (pod2 / "old").mkdir(parents=True)
    args2 = ["run", "--checkpoints", str(pod2), "--checkpoint-store", url, "--", "sh", "-c", "ls -A " + str(pod2)]
    proc, text = podguard(cli_node, args2, store=server.url)
    assert proc.returncode == 0, text
    assert f"podguard: warning: could not restore step-3.pt from {url}: step-3.pt came with CRC-32 " in text, text
    assert "falling back to none: the job starts from scratch" in text
    assert f"podguard: no checkpoint yet in {pod2}" in text
    assert sorted(p.name for p in pod2.iterdir()) == ["old"]  # nothing half-written, no hidden folder left


def test_a_store_that_does_not_answer_at_the_start_is_a_warning_and_the_job_runs(cli_node, tmp_path, s3):
    from s3server import Relay

    server, bucket = s3
    relay = Relay(server.port)
    relay.down()
    try:
        args = ["run", "--checkpoints", str(tmp_path / "pod"), "--checkpoint-store", f"s3://{bucket}/run1"]
        t0 = time.monotonic()
        proc, text = podguard(
            cli_node, [*args, "--", "echo", "trained"], store=relay.url, env={"AWS_MAX_ATTEMPTS": "3"}
        )
        took = time.monotonic() - t0
    finally:
        relay.close()
    assert proc.returncode == 0, text
    assert "trained" in text
    assert "warning: the checkpoint store does not answer now (cannot reach" in text
    assert "the job goes on, podguard tries the store again in the background" in text
    assert f"; store s3://{bucket}/run1 not reached" in text  # the END line
    assert took < 60, took  # (a few fast retries, not minutes)


def test_the_options_read_their_podguard_variables(cli_node, tmp_path, s3):
    """What the pod spec's [checkpoints] table passes: PODGUARD_CHECKPOINTS, _CHECKPOINT_STORE, _STORE_KEEP."""
    server, bucket = s3
    url = f"s3://{bucket}/env"
    env = {"PODGUARD_CHECKPOINTS": str(tmp_path / "pod"), "PODGUARD_CHECKPOINT_STORE": url, "PODGUARD_STORE_KEEP": "0"}
    proc, text = podguard(cli_node, ["run", "--", "true"], store=server.url, env=env)
    assert proc.returncode == 64 and "--store-keep=0 is not valid; expected an integer >= 1" in text, text
    env["PODGUARD_STORE_KEEP"] = "1"
    proc, text = podguard(cli_node, ["run", "--", *job_argv(tmp_path, steps=4, every=2, step_s=0.3)], store=server.url,
                          env=env)  # fmt: skip
    assert proc.returncode == 0, text
    assert f"podguard: stored step-4.pt in {url}" in text
    keys = server.keys(bucket, "env/")
    assert "env/step-4.pt.podguard-manifest.json" in keys and "env/step-2.pt" not in keys, keys  # keep 1
