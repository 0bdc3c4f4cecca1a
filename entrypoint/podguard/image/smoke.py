"""`podguard image smoke IMAGE`: quick checks of a built image, each timed, as a report.

    report = run_smoke(connect(), "podguard-test:latest")
    print(render_smoke(report)); report.ok

Checks: `--version`; `doctor --json` is one JSON object; the demo `train` passes its preflight and ends
with exit 0 (with the `docker run` -> first-job-line time and the preflight's share of it); `docker stop`
reaches the job through tini and podguard (exit 143, well before Docker's SIGKILL). Every container it
starts is removed afterwards.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from podguard.errors import UsageError
from podguard.image import LABEL_MANAGED
from podguard.image.timeline import Timeline

if TYPE_CHECKING:
    import docker

__all__ = ["SmokeCheck", "SmokeReport", "render_smoke", "run_smoke"]

STOP_TIMEOUT_S = 10
SIGTERM_EXIT = 143
_SLEEPER = "import time; print('WORKER UP', flush=True); time.sleep(600)"


@dataclass(frozen=True)
class SmokeCheck:
    name: str
    ok: bool
    seconds: float
    detail: str
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class SmokeReport:
    image: str
    checks: list[SmokeCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {"image": self.image, "ok": self.ok, "checks": [asdict(c) for c in self.checks]}


class _Runner:
    """Starts the image's containers, labelled, and removes every one of them at the end."""

    def __init__(self, client: docker.DockerClient, image: str) -> None:
        self.client, self.image, self.started = client, image, []

    def start(self, args: list[str], **kwargs: Any) -> Any:
        kwargs.setdefault("shm_size", "1g")
        container = self.client.containers.run(self.image, args, detach=True, labels={LABEL_MANAGED: "true"}, **kwargs)
        self.started.append(container)
        return container

    def output(self, args: list[str], timeout_s: float = 120) -> tuple[int, str]:
        container = self.start(args)
        code = int(container.wait(timeout=timeout_s)["StatusCode"])
        return code, container.logs(stdout=True, stderr=True).decode(errors="replace")

    def close(self) -> None:
        for container in self.started:
            with contextlib.suppress(Exception):  # already gone, or the engine went away: nothing to clean
                container.remove(force=True)


def _version(run: _Runner) -> tuple[bool, str, dict[str, float]]:
    code, out = run.output(["--version"])
    line = out.strip().splitlines()[-1] if out.strip() else ""
    return code == 0 and bool(re.match(r"podguard \d+\.\d+", line)), f"exit {code}: {line or 'no output'}", {}


def _doctor(run: _Runner) -> tuple[bool, str, dict[str, float]]:
    container = run.start(["doctor", "--json"])
    code = int(container.wait(timeout=120)["StatusCode"])
    stdout = container.logs(stdout=True, stderr=False).decode(errors="replace")
    try:
        data = json.loads(stdout)
    except ValueError:
        return False, f"exit {code}: stdout is not JSON: {stdout[:120]!r}", {}
    ok = code == 0 and isinstance(data, dict)
    return ok, f"exit {code}: {len(data) if isinstance(data, dict) else 0} sections", {}


def _demo(run: _Runner) -> tuple[bool, str, dict[str, float]]:
    t0 = time.time()
    container = run.start(["train"])
    timeline = Timeline.follow(container, t0)
    container.reload()
    code = int(container.attrs["State"]["ExitCode"])
    first, summary = timeline.first_job_line, timeline.summary
    timings = {"run_to_exit_s": round(time.time() - t0, 3)}
    if summary is not None:
        timings["run_to_summary_s"] = summary.at
    if first is not None:
        timings["run_to_first_job_line_s"] = first.at
    if timeline.preflight_ms is not None:
        timings["preflight_ms"] = timeline.preflight_ms
    done = timeline.first("DONE") is not None
    ok = code == 0 and timeline.verdict == "PASS" and done
    detail = (
        f"exit {code}, preflight {timeline.verdict or 'no summary line'}"
        + (f" in {timeline.preflight_ms:.0f} ms" if timeline.preflight_ms is not None else "")
        + (f", first job line {first.at:.2f} s after docker run" if first else ", no job line")
        + ("" if done else ", no DONE line")
    )
    return ok, detail, timings


def _signals(run: _Runner) -> tuple[bool, str, dict[str, float]]:
    container = run.start(["train", "--", "python3", "-c", _SLEEPER])
    deadline = time.monotonic() + 120
    while b"WORKER UP" not in container.logs():
        container.reload()
        if container.status != "running" or time.monotonic() > deadline:
            return False, f"the job never printed WORKER UP (status {container.status})", {}
        time.sleep(0.1)
    start = time.monotonic()
    container.stop(timeout=STOP_TIMEOUT_S)
    took = round(time.monotonic() - start, 3)
    container.reload()
    code = int(container.attrs["State"]["ExitCode"])
    ok = code == SIGTERM_EXIT and took < STOP_TIMEOUT_S
    return (
        ok,
        f"docker stop -> exit {code} in {took:.2f} s (SIGKILL would come at {STOP_TIMEOUT_S} s)",
        {"stop_s": took},
    )


CHECKS: dict[str, Callable[[_Runner], tuple[bool, str, dict[str, float]]]] = {
    "version": _version,
    "doctor --json": _doctor,
    "demo train": _demo,
    "docker stop": _signals,
}


def run_smoke(
    client: docker.DockerClient,
    image: str,
    on_check: Callable[[SmokeCheck], None] | None = None,
    only: Sequence[str] = (),
) -> SmokeReport:
    """Run the checks (all, or those named in `only`; a failing one does not stop the rest); every
    container is removed at the end."""
    from docker.errors import DockerException  # noqa: PLC0415  lazy: docker SDK, the podguard[image] extra

    unknown = [name for name in only if name not in CHECKS]
    if unknown:
        raise UsageError(f"--check {unknown[0]!r} is not a smoke check; valid: {', '.join(CHECKS)}")
    report, runner = SmokeReport(image), _Runner(client, image)
    try:
        for name, check in CHECKS.items():
            if only and name not in only:
                continue
            start = time.monotonic()
            try:
                ok, detail, timings = check(runner)
            except DockerException as exc:
                ok, detail, timings = False, f"engine error: {str(exc).splitlines()[0]}", {}
            result = SmokeCheck(name, ok, round(time.monotonic() - start, 2), detail, timings)
            report.checks.append(result)
            if on_check is not None:
                on_check(result)
    finally:
        runner.close()
    return report


def render_check(check: SmokeCheck) -> str:
    return f"  {'ok  ' if check.ok else 'FAIL'} {check.name:<14} {check.seconds:6.2f} s  {check.detail}"


def render_smoke(report: SmokeReport) -> str:
    passed = sum(c.ok for c in report.checks)
    verdict = "PASS" if report.ok else "FAIL"
    total = sum(c.seconds for c in report.checks)
    return f"podguard image smoke {report.image}: {verdict} ({passed}/{len(report.checks)} checks, {total:.1f} s)"
