"""Buffering filters in the job's own pipeline (issue 30, item 3): `python steps.py | perl -pe ...`, `| mawk`,
`| sed`, and a C++ program with `sync_with_stdio(false)` print a step every 0.5 s; none is called hung. perl is made
line by line (PERL5OPT's autoflush module), C++ by the preloaded shim, sed by stdbuf; mawk cannot be, and the bytes
it reads count as the job's activity (named once). A job whose pipeline is stuck is still hung. Real perl, mawk,
sed and g++ (skipped with a reason where one is missing)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobproc import run_podguard, script
from podguard.launch.line_shims import PERL_MODULE, buffering_warnings, shim_env

STEPS = """
    import sys, time
    steps, then = int(sys.argv[1]), sys.argv[2]
    for i in range(steps):
        print(f"step {i}", flush=True)
        time.sleep(0.5)
    if then == "hang":
        time.sleep(3600)
    """
CXX = r"""
#include <iostream>
#include <unistd.h>
int main() {
    std::ios_base::sync_with_stdio(false);
    for (int i = 0; i < 28; i++) { std::cout << "step " << i << "\n"; usleep(500000); }
    return 0;
}
"""
FILTERS = {
    "perl": "perl -pe 's/^/[train] /'",
    "mawk": "mawk '{print strftime(), $0}'",
    "sed": "sed 's/^/[train] /'",
}


def _needs(*programs: str) -> None:
    for program in programs:
        if shutil.which(program) is None:
            pytest.skip(f"{program} is not installed (apt-get install -y {program})")


def _pipeline(tmp_path: Path, filt: str, steps: int, then: str) -> list[str]:
    job = script(tmp_path, "steps.py", STEPS)
    return ["bash", "-c", f"{sys.executable} {job} {steps} {then} | {FILTERS[filt]}"]


@pytest.mark.slow
@pytest.mark.parametrize("filt", list(FILTERS))
def test_a_healthy_pipeline_through_a_buffering_filter_is_not_hung(tmp_path, cli_node, filt):
    _needs(filt)
    args = ["run", "--hang-timeout", "5", "--grace", "1", "--", *_pipeline(tmp_path, filt, 28, "exit")]
    proc = run_podguard(cli_node, args, cpu=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert out.count("step 27") == 1 and "HUNG" not in out
    notes = [ln for ln in out.splitlines() if "holds its output in blocks" in ln]
    if filt == "mawk":  # cannot be made line by line: what it reads is the job's activity, said once
        assert len(notes) == 1 and "mawk (pid " in notes[0] and "-W interactive" in notes[0], out[-3000:]
    else:  # line by line: no need for the sign
        assert notes == []


@pytest.mark.slow
def test_a_cxx_program_without_stdio_sync_is_not_hung(tmp_path, cli_node):
    _needs("g++")
    (tmp_path / "steps.cc").write_text(CXX)
    subprocess.run(["g++", "-O1", "-o", str(tmp_path / "steps"), str(tmp_path / "steps.cc")], check=True)
    proc = run_podguard(
        cli_node, ["run", "--hang-timeout", "5", "--grace", "1", "--", str(tmp_path / "steps")], cpu=True, timeout=120
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "step 27" in proc.stdout and "sync_with_stdio" not in out  # (no warning: the shim is there)


@pytest.mark.slow
def test_a_stuck_pipeline_through_mawk_is_still_hung(tmp_path, cli_node):
    _needs("mawk")
    started = time.monotonic()
    args = ["run", "--hang-timeout", "5", "--grace", "1", "--", *_pipeline(tmp_path, "mawk", 4, "hang")]
    proc = run_podguard(cli_node, args, cpu=True, timeout=120)
    assert proc.returncode == 79, (proc.stdout + proc.stderr)[-3000:]
    assert time.monotonic() - started < 2 + 5 + 60


# ---------------------------------------------------------------------------------------------------------------
# the shims alone


def test_the_user_s_perl_settings_come_first_and_the_module_is_added_once(tmp_path: Path) -> None:
    env = shim_env({"PERL5OPT": "-Mstrict", "PERL5LIB": "/opt/lib"}, "/lib/libstdbuf.so")
    if "PERL5OPT" not in env:
        pytest.skip("no private cache folder for the perl module here")
    assert env["PERL5OPT"] == f"-Mstrict -M{PERL_MODULE}"
    assert (
        env["PERL5LIB"].startswith("/opt/lib:")
        and (Path(env["PERL5LIB"].split(":")[1]) / f"{PERL_MODULE}.pm").is_file()
    )
    assert "PERL5OPT" not in shim_env({"PERL5OPT": f"-M{PERL_MODULE}"}, "/lib/libstdbuf.so")
    if shutil.which("perl"):  # taint mode ignores both variables (perlrun): the job still runs
        taint = subprocess.run(["perl", "-T", "-e", 'print "ok\\n"'], env=env, capture_output=True, text=True)
        assert taint.returncode == 0 and taint.stdout == "ok\n"
        to_file = subprocess.run(["perl", "-e", "print $|"], env=env, capture_output=True, text=True)
        assert to_file.stdout == "1"  # (a pipe: autoflush on)


def test_a_cxx_program_podguard_cannot_keep_line_by_line_is_named_at_start(tmp_path: Path) -> None:
    _needs("g++")
    (tmp_path / "steps.cc").write_text(CXX)
    subprocess.run(["g++", "-O1", "-o", str(tmp_path / "steps"), str(tmp_path / "steps.cc")], check=True)
    (warning,) = buffering_warnings([str(tmp_path / "steps")], {"PATH": "/usr/bin", "PODGUARD_LINE_BUFFERING": "0"})
    assert warning.startswith("steps calls std::ios_base::sync_with_stdio") and "PODGUARD_LINE_BUFFERING=0" in warning
    shimmed = {"PATH": "/usr/bin", "LD_PRELOAD": "/lib/libstdbuf.so:/c/libpodguard_linebuf-x.so"}
    assert buffering_warnings([str(tmp_path / "steps")], shimmed) == []
    assert buffering_warnings([sys.executable, "x.py"], {"PATH": "/usr/bin"}) == []  # (not a C++ program)
