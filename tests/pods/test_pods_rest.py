"""podguard's REST v2 client against the stand-in API: retries, error mapping, the key, lost creates, SSE."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pods_support import KEY, standin  # noqa: F401 (fixture)

from podguard import console
from podguard.errors import ExitCode
from podguard.pods.api import open_api
from podguard.pods.auth import load_api_key
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.follow import LogFollower
from podguard.pods.placement import create_first_fit, first_fit
from podguard.pods.pod import GpuInfo, LogEvent, PodAction, PodRequest
from podguard.pods.retry import RetryPolicy, with_retry
from podguard.pods.sse import parse_sse
from podguard.pods.tuning import Tuning

A40 = PodRequest(name="t", image="img:1", gpu=GpuInfo("NVIDIA A40", 1), ports=("22/tcp",))


def api(retry_for: float = 5.0, **tuning: float):  # type: ignore[no-untyped-def]
    return open_api("rest", retry_for=retry_for, tuning=Tuning(backoff_s=0.01, backoff_cap_s=0.05, **tuning))


def _pod(standin, name: str = "t") -> str:  # noqa: F811
    return standin.world.create({"name": name, "image": "img:1", "gpu": {"id": "NVIDIA A40", "count": 1}}).id


@pytest.mark.parametrize("kind", ["html502", "500", "drop", "429"])
def test_transient_failures_are_retried_until_the_call_succeeds(standin, kind):  # noqa: F811
    _pod(standin)
    standin.fault("GET", r"^/v2/pods$", kind, times=2)
    pods = api().list_pods()
    assert [p.name for p in pods] == ["t"]
    assert len(standin.calls("GET", r"^/v2/pods$")) == 3


def test_retry_after_is_honoured(standin):  # noqa: F811
    standin.fault("GET", r"^/v2/pods$", "429", retry_after="0.3")
    api().list_pods()
    first, second = standin.calls("GET", r"^/v2/pods$")
    assert second.at - first.at >= 0.28


@pytest.mark.parametrize(
    ("setup", "kind", "code"),
    [
        (lambda s: setattr(s.world, "balance_ok", False), ApiErrorKind.NO_BALANCE, ExitCode.API_ACCESS),
        (lambda s: None, ApiErrorKind.INVALID, ExitCode.USAGE),
    ],
    ids=["402", "422"],
)
def test_402_and_422_are_never_retried(standin, setup, kind, code):  # noqa: F811
    setup(standin)
    request = A40 if kind is ApiErrorKind.NO_BALANCE else PodRequest(name="t", image="", gpu=GpuInfo("NVIDIA A40", 1))
    with pytest.raises(ApiError) as info:
        create_first_fit(api(), [request])
    assert info.value.kind is kind and info.value.code == code
    assert len(standin.calls("POST", r"^/v2/pods$")) == 1


def test_a_wrong_key_is_77_naming_where_it_came_from_and_not_retried(standin, monkeypatch):  # noqa: F811
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_WRONGwrongWRONGwrongWRONGwrong")
    with pytest.raises(ApiError) as info:
        api().list_pods()
    assert info.value.code == ExitCode.API_ACCESS
    assert "RUNPOD_API_KEY" in info.value.message and "WRONG" not in info.value.message
    assert len(standin.requests) == 1


def test_a_server_error_that_echoes_the_key_is_masked_in_every_console_line(monkeypatch):
    """Once loaded, the key is never shown in a console line, even where a server's error text echoes it and no
    transport scrubbed it (an SDK's exception, a proxy's error page): `  not placed: <detail>` says the text."""
    key = "Q7hXw2LmZp4RtY9sKeyOfThisTest"  # no token shape: redaction alone would not hide it
    monkeypatch.setenv("RUNPOD_API_KEY", key)
    load_api_key()

    def refused(_request: PodRequest) -> None:
        raise ApiError(ApiErrorKind.NO_CAPACITY, "no capacity", detail=f"no room for the request of {key}")

    with console.captured() as lines, pytest.raises(ApiError):
        first_fit([A40], refused, lambda name: [], RetryPolicy(budget_s=1), kind="pod", none_fits="the test")
    placed = [line for line in lines if "not placed" in line]
    assert placed == ["podguard:   not placed: no room for the request of ***"], lines
    assert not any(key in line for line in lines)


def test_the_key_comes_from_the_sdk_config_file_when_the_variable_is_unset(standin, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.delenv("RUNPOD_API_KEY")
    with pytest.raises(ApiError) as info:
        load_api_key()
    assert info.value.code == ExitCode.API_ACCESS
    assert "RUNPOD_API_KEY" in info.value.message and ".runpod/config.toml" in info.value.message
    config = Path.home() / ".runpod" / "config.toml"
    config.parent.mkdir()
    config.write_text(f'[default]\napi_key = "{KEY}"\n')
    assert load_api_key().source.endswith("config.toml [default]")
    assert api().list_pods() == []
    assert standin.requests[-1].headers["Authorization"] == f"Bearer {KEY}"


def test_the_key_travels_only_in_the_authorization_header(standin):  # noqa: F811
    client = api()
    pod_id = _pod(standin)
    client.list_pods()
    client.get_pod(pod_id)
    client.act(pod_id, PodAction.STOP)
    assert standin.requests
    for rec in standin.requests:
        assert KEY not in rec.target and KEY.encode() not in rec.body
        assert [k for k, v in rec.headers.items() if KEY in v] == ["Authorization"]
    assert KEY not in repr(load_api_key()) and KEY not in str(load_api_key())


def test_a_slow_answer_times_out_and_is_retried(standin):  # noqa: F811
    standin.fault("GET", r"^/v2/pods$", "slow", delay=1.0)
    started = time.monotonic()
    assert api(request_timeout_s=0.2).list_pods() == []
    assert time.monotonic() - started < 0.9
    assert len(standin.calls("GET", r"^/v2/pods$")) == 2


def test_retries_stop_at_the_budget_with_exit_75(standin):  # noqa: F811
    standin.fault("GET", r"^/v2/pods$", "500", times=1000)
    started = time.monotonic()
    with pytest.raises(ApiError) as info:
        api(retry_for=0.3).list_pods()
    assert info.value.code == ExitCode.GPUS_BUSY and "--retry-for" in info.value.message
    assert time.monotonic() - started < 1.0


def test_a_lost_create_answer_is_looked_up_by_name_not_sent_again(standin):  # noqa: F811
    standin.fault("POST", r"^/v2/pods$", "lost")
    pod = create_first_fit(api(), [A40])
    assert [p.id for p in standin.world.pods.values()] == [pod.id]
    assert len(standin.calls("POST", r"^/v2/pods$")) == 1


def test_a_create_that_failed_before_it_happened_is_sent_again(standin):  # noqa: F811
    standin.fault("POST", r"^/v2/pods$", "drop")
    create_first_fit(api(), [A40])
    assert len(standin.world.pods) == 1
    assert len(standin.calls("POST", r"^/v2/pods$")) == 2  # the lookup found nothing, so it was safe


def test_capacity_is_tried_candidate_by_candidate_and_69_lists_them(standin):  # noqa: F811
    h100 = PodRequest(name="t", image="img:1", gpu=GpuInfo("NVIDIA H100 80GB HBM3", 8))
    with pytest.raises(ApiError) as info:
        create_first_fit(api(), [h100, h100.__class__(**{**h100.__dict__, "data_center": "US-TX-3"})])
    assert info.value.code == ExitCode.GPUS_MISSING
    assert "8x NVIDIA H100 80GB HBM3 in any data centre" in info.value.message
    assert "in US-TX-3" in info.value.message


def test_sse_parser_joins_data_lines_and_skips_comments():
    raw = [
        b": keep-alive\r\n",
        b"\n",
        b"id: 1\n",
        b"data: a\n",
        b"data: b\n",
        b"\n",
        b"event: x\n",
        b"data: c\n",
        b"\n",
    ]
    events = list(parse_sse(raw))
    assert [(e.id, e.data, e.event) for e in events] == [("1", "a\nb", "message"), ("1", "c", "x")]


def test_the_log_follower_resumes_after_a_cut_without_losing_or_repeating_lines(standin):  # noqa: F811
    standin.world.timing.provision_s = 60.0  # the pod writes nothing of its own during the test
    pod_id = _pod(standin)
    for i in range(3):
        standin.world.emit(pod_id, f"line {i}")
    follower = LogFollower(api(), pod_id, since=None, tail=100, backoff_s=0.01)
    follower.start()
    try:
        got = [_next_line(follower) for _ in range(3)]
        standin.cut_streams()
        for i in range(3, 6):
            standin.world.emit(pod_id, f"line {i}")
        got += [_next_line(follower) for _ in range(3)]
    finally:
        follower.stop()
    assert got == [f"line {i}" for i in range(6)]
    reopened = standin.calls("GET", r"/logs$")
    assert len(reopened) >= 2 and reopened[-1].headers.get("Last-Event-ID", "").endswith("/000000000003")


def _next_line(follower: LogFollower) -> str:
    item = follower.get(5.0)
    assert isinstance(item, LogEvent), item
    return item.line


def test_retry_delay_honours_retry_after_and_jitters_within_the_ceiling():
    policy = RetryPolicy(base_s=1.0, cap_s=4.0, rng=lambda: 0.0)
    assert policy.delay(0, ApiError(ApiErrorKind.RATE_LIMITED, "x", retry_after=7)) == 7
    assert [policy.delay(a, ApiError(ApiErrorKind.TRANSIENT, "x")) for a in range(4)] == [0.5, 1.0, 2.0, 2.0]
    top = RetryPolicy(base_s=1.0, cap_s=4.0, rng=lambda: 0.999999)
    assert top.delay(5, ApiError(ApiErrorKind.TRANSIENT, "x")) <= 4.0


def test_with_retry_gives_up_at_once_when_retry_after_exceeds_the_budget():
    calls = []

    def call() -> None:
        calls.append(1)
        raise ApiError(ApiErrorKind.RATE_LIMITED, "HTTP 429", retry_after=120)

    with pytest.raises(ApiError) as info:
        with_retry(call, RetryPolicy(budget_s=60, sleep=lambda _s: None), what="list pods")
    assert len(calls) == 1 and "asks to wait 120s" in info.value.message
