"""The real `runpod` SDK (GraphQL) against the stand-in: encoding, error mapping, spot pods, templates."""

from __future__ import annotations

import pytest
from pods_support import KEY, standin  # noqa: F401 (fixture)
from standin_gql import GqlSyntaxError, parse_operation

from podguard.errors import ExitCode
from podguard.pods.api import open_api
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.graphql_api import gql_text
from podguard.pods.placement import create_first_fit
from podguard.pods.pod import GpuInfo, PodAction, PodRequest, TemplateRequest, Volume
from podguard.pods.tuning import Tuning

runpod = pytest.importorskip("runpod")

HOSTILE = [
    'quote " and \\" escaped',
    "new\nline\r\ttab",
    "braces } { ) ( ] [ $x @y #z",
    "unicode é ü 中文 😀 \u2028",
    'injection", imageName: "evil',
    "back\\slash\\",
    "",
]


def gql(retry_for: float = 5.0):  # type: ignore[no-untyped-def]
    return open_api("graphql", retry_for=retry_for, tuning=Tuning(backoff_s=0.01, backoff_cap_s=0.05))


@pytest.mark.parametrize("value", HOSTILE)
def test_gql_text_round_trips_through_a_strict_graphql_parser(value):
    op = parse_operation(f'query {{ pod(input: {{podId: "{gql_text(value)}"}}) {{ id }} }}')
    assert op.fields[0].args["input"]["podId"] == value
    assert gql_text(value).isascii() and '"' not in gql_text(value) and "\n" not in gql_text(value)


def test_the_sdk_alone_breaks_on_a_quote_which_is_why_values_are_encoded(standin):  # noqa: F811
    """The stand-in is strict like a real server: an unescaped quote is a syntax error, not silently accepted."""
    with pytest.raises(runpod.error.QueryError):
        runpod.api.graphql.run_graphql_query('query { pod(input: {podId: "a"b"}) { id } }', api_key=KEY)
    with pytest.raises(GqlSyntaxError):
        parse_operation('mutation { podStop(input: {podId: "line\nbreak"}) { id } }')


def _hostile_request(**kw: object) -> PodRequest:
    env = {f"V{i}": v for i, v in enumerate(HOSTILE)}
    return PodRequest(
        name='job "x" {😀}',
        image="img:1",
        args=HOSTILE[1] + HOSTILE[0],
        env=env,
        ports=("22/tcp", "8888/http"),
        gpu=GpuInfo("NVIDIA A40", 2),
        volume=Volume(path="/work space/é", size_gb=20),
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("spot", [False, True], ids=["on-demand", "spot"])
def test_hostile_values_arrive_verbatim_through_the_sdk(standin, spot):  # noqa: F811
    request = _hostile_request(interruptible=spot, bid_per_gpu=0.3 if spot else None)
    pod = gql().create_pod(request)
    record = standin.world.pods[pod.id]
    assert (record.name, record.args, record.env) == (request.name, request.args, request.env)
    assert record.mounts["persistent"] == {"size": 20, "path": "/work space/é"}
    assert record.interruptible is spot and record.gpu_count == 2
    assert pod.name == request.name and pod.env == request.env  # and back through the SDK's answer


def test_a_spot_pod_without_a_bid_bids_the_current_minimum(standin):  # noqa: F811
    pod = gql().create_pod(PodRequest(name="s", image="img:1", gpu=GpuInfo("NVIDIA A40", 1), interruptible=True))
    assert standin.world.pods[pod.id].bid == pytest.approx(0.20)


@pytest.mark.parametrize(("kind", "mapped"), [("429", "KeyError"), ("html502", "JSONDecodeError"), ("drop", "dropped")])
def test_sdk_failures_are_mapped_and_retried(standin, kind, mapped):  # noqa: F811
    standin.world.create({"name": "p", "image": "img:1", "gpu": {"id": "NVIDIA A40", "count": 1}})
    standin.fault("POST", r"^/graphql$", kind, times=2)
    assert [p.name for p in gql().list_pods()] == ["p"]
    assert len(standin.calls("POST", r"^/graphql$")) == 3


def test_sdk_transient_failures_past_the_budget_end_in_75(standin):  # noqa: F811
    standin.fault("POST", r"^/graphql$", "429", times=1000)
    with pytest.raises(ApiError) as info:
        gql(retry_for=0.2).list_pods()
    assert info.value.code == ExitCode.GPUS_BUSY and "no data" in info.value.message


def test_sdk_capacity_errors_fall_back_to_the_next_candidate(standin):  # noqa: F811
    h100 = PodRequest(name="c", image="img:1", gpu=GpuInfo("NVIDIA H100 80GB HBM3", 1))
    a40 = PodRequest(name="c", image="img:1", gpu=GpuInfo("NVIDIA A40", 1))
    pod = create_first_fit(gql(), [h100, a40])
    assert pod.gpu == GpuInfo("NVIDIA A40", 1)


def test_sdk_lost_create_is_not_duplicated(standin):  # noqa: F811
    standin.fault("POST", r"^/graphql$", "lost", body_contains="podFindAndDeployOnDemand")
    a40 = PodRequest(name="once", image="img:1", gpu=GpuInfo("NVIDIA A40", 1))
    pod = create_first_fit(gql(), [a40])
    assert [p.id for p in standin.world.pods.values()] == [pod.id]


def test_sdk_rejected_key_is_77(standin, monkeypatch):  # noqa: F811
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_WRONGwrongWRONGwrongWRONGwrong")
    with pytest.raises(ApiError) as info:
        gql().list_pods()
    assert info.value.kind is ApiErrorKind.AUTH and info.value.code == ExitCode.API_ACCESS


def test_lifecycle_through_the_sdk_and_restart_through_rest(standin):  # noqa: F811
    api = gql()
    pod = api.create_pod(PodRequest(name="l", image="img:1", gpu=GpuInfo("NVIDIA A40", 1)))
    record = standin.world.pods[pod.id]
    record.status = "RUNNING"
    api.act(pod.id, PodAction.RESTART)
    assert standin.calls("POST", r"/action$")  # GraphQL has no restart
    record.status = "RUNNING"
    assert api.act(pod.id, PodAction.STOP).status == "EXITED"  # type: ignore[union-attr]
    api.act(pod.id, PodAction.START)
    assert record.status in ("STARTING", "RUNNING")
    assert api.act(pod.id, PodAction.TERMINATE) is None and record.status == "TERMINATED"
    with pytest.raises(ApiError) as info:
        api.get_pod(pod.id)
    assert info.value.code == ExitCode.NO_SUCH_POD


def test_template_create_then_update_with_hostile_values(standin):  # noqa: F811
    t = TemplateRequest(
        name="tpl",
        image="img:1",
        args=HOSTILE[0],
        env={"A": HOSTILE[1]},
        ports=("22/tcp",),
        disk_gb=20,
        volume=None,
        ssh=True,
        category="NVIDIA",
    )
    tid, created = gql().upsert_template(t)
    assert created and standin.world.templates[tid]["args"] == HOSTILE[0]
    tid2, created2 = gql().upsert_template(TemplateRequest(**{**t.__dict__, "args": HOSTILE[2]}))
    assert (tid2, created2) == (tid, False) and standin.world.templates[tid]["args"] == HOSTILE[2]
    assert standin.world.templates[tid]["env"] == {"A": HOSTILE[1]}
