"""The reconciler's rules, pure (no process, no HTTP): converge on one, the user's word and its generations, the
mark, a spec edited since, a crash loop, an unknown status, the fence before every action."""

from __future__ import annotations

from dataclasses import replace

import pytest

from podguard.pods.keeper.converge import Plan, Seen, converge, pick
from podguard.pods.keeper.decide import (
    CRASH_RESTARTS,
    CRASH_WINDOW_S,
    Act,
    Decision,
    JobView,
    NodeState,
    Observed,
    Outcome,
    decide,
)
from podguard.pods.keeper.fence import Fence, Superseded
from podguard.pods.keeper.intent import Intent, Word, finished, is_over, may_act, new_keep_id, spoken, why_not
from podguard.pods.keeper.lines import read_line
from podguard.pods.keeper.spec_change import spec_changes
from podguard.pods.mark import ENV_MARK, Mark, mark_of, marked_spec, name_hash, owned, spec_hash, with_mark
from podguard.pods.pod import GpuInfo, Pod, PodStatus
from podguard.pods.spec import parse_spec

R, E, X, P, U, T = (
    PodStatus.RUNNING,
    PodStatus.ERROR,
    PodStatus.EXITED,
    PodStatus.PROVISIONING,
    PodStatus.UNKNOWN,
    PodStatus.TERMINATED,
)


def s(pid: str, status: PodStatus = R, *, owned: bool | None = True, at: str | None = None, runs: bool = False) -> Seen:
    return Seen(pid, status, owned, at, runs=runs)


# -- converge ---------------------------------------------------------------------------------------------------------
def test_nothing_of_the_name_is_missing_and_a_stranger_alone_is_missing_too():
    assert converge([], kept="") == Plan("", missing=True)
    assert converge([s("x", owned=False)], kept="") == Plan("", strangers=("x",), missing=True)
    assert converge([s("a", T)], kept="a") == Plan("", missing=True)  # a terminated one is gone


def test_an_owner_not_known_yet_is_waited_for_never_missing():
    plan = converge([s("c", owned=None), s("x", owned=False)], kept="")
    assert plan == Plan("", strangers=("x",), unknown=("c",), missing=False)


def test_the_one_kept_stays_and_every_other_of_its_own_is_surplus_strangers_apart():
    plan = converge([s("a", runs=True), s("b", runs=True, at="0"), s("x", owned=False)], kept="a")
    assert plan == Plan("a", surplus=("b",), strangers=("x",))


def test_the_one_kept_stays_while_stopped_or_unknown_but_not_in_error():
    assert converge([s("a", X), s("b", runs=True)], kept="a").keep == "a"  # maintenance: it is started again
    assert converge([s("a", U), s("b", runs=True)], kept="a").keep == "a"
    assert converge([s("a", E), s("b", runs=True)], kept="a") == Plan("b", surplus=("a",))


def test_without_the_one_kept_one_that_runs_then_one_not_in_error_then_the_oldest():
    assert pick([s("a", P, at="1"), s("b", runs=True, at="2"), s("c", runs=True, at="3")], "").id == "b"
    assert pick([s("a", E, at="1"), s("b", P, at="3"), s("c", X, at="2")], "").id == "c"
    assert pick([s("a", E, at="2"), s("b", E, at="1")], "").id == "b"
    assert pick([s("a", E, at="2"), s("b", E, at="1")], "a").id == "a"  # all in ERROR: the one kept before
    assert pick([s("b", P), s("a", P)], "").id == "a"  # no createdAt (GraphQL): the lowest id
    assert pick([s("b", P, at="1"), s("a", P)], "").id == "b"  # a known createdAt sorts before an unknown one
    assert pick([s("b", P, at="2"), s("a", P, at="2")], "").id == "a"  # the same moment: the lowest id
    assert pick([Seen("a", R, True, "1"), s("b", runs=True, at="2")], "").id == "b"  # not known to run by default


# -- the user's word --------------------------------------------------------------------------------------------------
def test_each_word_is_the_next_generation_and_carries_the_adoptions():
    first = spoken(None, Word.KEPT, by="pod keep on a", at="t1", keep="k1-aa", adopt=("p1",))
    assert (first.word, first.gen, first.keep, first.adopted) == (Word.KEPT, 1, "k1-aa", ("p1",))
    down = spoken(first, Word.DOWN, by="pod down on b", at="t2", keep="ignored", adopt=("p2", "p1"))
    assert (down.word, down.gen, down.keep, down.adopted, down.by, down.at) == (
        Word.DOWN,
        2,
        "",
        ("p1", "p2"),
        "pod down on b",
        "t2",
    )


def test_the_words_as_the_record_spells_them():
    assert [w.value for w in Word] == ["kept", "down", "stopped", "done"]
    assert spoken(None, Word.KEPT, by="b", at="t").keep == ""  # no identity given: none invented


def test_a_keeper_may_act_only_while_the_record_is_its_own_kept():
    mine = Intent(Word.KEPT, 3, "k3-aa")
    assert may_act(mine, mine) and not is_over(mine, mine) and why_not(mine, mine) == ""
    assert not may_act(None, mine) and not is_over(None, mine)
    assert why_not(None, mine) == "the keep's record cannot be read"
    newer = Intent(Word.KEPT, 4, "k4-bb", by="pod keep on laptop")
    assert not may_act(newer, mine) and is_over(newer, mine)
    assert why_not(newer, mine) == "the user's word changed: kept by keep k4-bb (generation 4, by pod keep on laptop)"
    assert not may_act(Intent(Word.KEPT, 4, "k3-aa"), mine)  # the same identity, another generation
    twin = Intent(Word.KEPT, 3, "k3-zz")
    assert not may_act(twin, mine) and not is_over(twin, mine)
    assert why_not(twin, mine) == "another keep holds this generation (kept by keep k3-zz (generation 3))"
    done = Intent(Word.DONE, 3, "k3-aa", outcome="success")
    assert not may_act(done, mine) and is_over(done, mine)
    assert why_not(done, mine) == "the user's word changed: done (success) (generation 3)"
    older = Intent(Word.DOWN, 2)
    assert not may_act(older, mine) and not is_over(older, mine)
    assert why_not(older, mine) == "the record went back to an older word (taken down (generation 2))"
    assert why_not(Intent(Word.STOPPED, 5), mine) == "the user's word changed: stopped (generation 5)"
    assert Intent(Word.DONE, 5).describe() == "done (ended) (generation 5)"


def test_done_is_written_only_over_the_keeps_own_kept():
    mine = Intent(Word.KEPT, 3, "k3-aa", adopted=("p1",))
    done = finished(mine, mine, "success", 0, at="t9")
    assert done == Intent(Word.DONE, 3, "k3-aa", at="t9", adopted=("p1",), outcome="success", code=0)
    assert finished(Intent(Word.DOWN, 4), mine, "success", 0, at="t") is None
    assert finished(None, mine, "success", 0, at="t") is None


def test_an_intent_reads_back_from_its_json_and_a_stranger_record_is_none():
    said = Intent(Word.DONE, 7, "k7-aa", by="b", at="t", adopted=("p",), outcome="failed", code=3, extra={"x": "1"})
    assert Intent.from_json(said.to_json()) == said
    assert said.to_json()["word"] == "done" and Intent(Word.KEPT, 1).to_json() == {"word": "kept", "gen": 1}
    assert Intent.from_json({"word": "kept", "gen": 1, "extra": None}).extra == {}
    assert Intent.from_json({"word": "done", "gen": 2, "code": "3"}).code is None  # not a number: no exit code
    assert Intent.from_json({"word": "kept", "gen": 1}) == Intent(Word.KEPT, 1)
    assert set(Intent(Word.KEPT, 1).to_json()) == {"word", "gen"}
    for bad in (None, [], {"word": "later", "gen": 1}, {"word": "kept"}, {"word": "kept", "gen": "x"}):
        assert Intent.from_json(bad) is None
    assert Intent.from_json({"word": "done", "gen": 2, "code": True}).code is None  # a bool is not an exit code
    assert new_keep_id(7).startswith("k7-") and new_keep_id(7) != new_keep_id(7)
    assert Intent(Word.KEPT, 2, "k2-a").describe() == "kept by keep k2-a (generation 2)"
    assert Intent(Word.DOWN, 2, by="x", at="y").describe() == "taken down (generation 2, by x, at y)"


# -- the fence --------------------------------------------------------------------------------------------------------
class Store:
    def __init__(self, current: Intent | None) -> None:
        self.current, self.writes = current, []

    def read(self) -> Intent | None:
        return self.current

    def write(self, intent: Intent) -> None:
        self.writes.append(intent)
        self.current = intent


def test_the_fence_lets_its_own_keep_act_and_stops_it_at_a_newer_word():
    mine = Intent(Word.KEPT, 3, "k3-aa")
    store = Store(mine)
    fence = Fence(store, mine, on_lease=lambda until: 7)  # type: ignore[arg-type]
    fence.check()
    assert fence.lease(5.0) == 7
    store.current = Intent(Word.DOWN, 4)
    with pytest.raises(Superseded) as raised:
        fence.check()
    assert raised.value.current.word is Word.DOWN and raised.value.code == 0 and fence.word is Word.DOWN


def test_a_removed_record_is_written_again_with_the_keeps_own_word():
    mine = Intent(Word.KEPT, 3, "k3-aa")
    store = Store(None)
    Fence(store, mine).check()  # type: ignore[arg-type]
    assert store.writes == [mine]


def test_the_fence_writes_done_only_over_its_own_word():
    mine = Intent(Word.KEPT, 3, "k3-aa")
    store = Store(mine)
    assert Fence(store, mine).finish("success", 0)  # type: ignore[arg-type]
    assert store.current.word is Word.DONE and store.current.outcome == "success"
    newer = Store(Intent(Word.DOWN, 4))
    assert not Fence(newer, mine).finish("success", 0) and newer.writes == []  # type: ignore[arg-type]


# -- the mark ---------------------------------------------------------------------------------------------------------
SPEC = {"name": "trainer", "image": "img:1", "gpu": {"types": ["NVIDIA A40"], "count": 2}, "env": {"A": "1"}}


def pod(env: dict[str, str], *, pid: str = "p1", gpu: int = 2, **kw: object) -> Pod:
    fields = dict(image="img:1", args="train", disk_gb=50, port_specs=("22/tcp",))
    fields.update(kw)  # type: ignore[arg-type]
    return Pod(pid, "trainer", R, GpuInfo("NVIDIA A40", gpu), 0.9, None, (), (), env=env, **fields)  # type: ignore[arg-type]


def test_a_marked_spec_marks_its_pods_for_its_name_with_the_keep_the_spec_and_the_gpus():
    spec = parse_spec(SPEC)
    made = marked_spec(spec, keep="k1-aa")
    mark = mark_of(made.env)
    assert mark == Mark(name_hash("trainer"), "k1-aa", spec_hash(spec), 2)
    assert made.env["A"] == "1" and spec_hash(made) == spec_hash(spec)  # the mark is not part of the spec's hash
    assert owned(pod(made.env), "trainer") and not owned(pod(made.env), "trainer2")
    assert not owned(pod({}), "trainer") and owned(pod({}, pid="p9"), "trainer", adopted=("p9",))
    cpu = parse_spec({**{k: v for k, v in SPEC.items() if k != "gpu"}, "cpu": {"id": "cpu3c", "vcpus": 2}})
    assert mark_of(marked_spec(cpu, keep="up").env).gpus is None
    assert with_mark({ENV_MARK: "old", "B": "2"}, mark) == {"B": "2", ENV_MARK: mark.text()}


@pytest.mark.parametrize(
    "raw",
    ["", "podguard/2 name=a keep=b", "podguard/1 keep=b", "podguard/1 name=a", "podguard/1", "name=a keep=b"],
)
def test_what_does_not_read_as_a_mark_is_none(raw):
    assert mark_of({ENV_MARK: raw}) is None


def test_a_mark_reads_back_with_and_without_its_optional_fields():
    assert mark_of({ENV_MARK: "podguard/1 name=a keep=b spec=- gpus=x"}) == Mark("a", "b", "", None)
    assert mark_of({ENV_MARK: Mark("a", "b", "c", 4).text()}) == Mark("a", "b", "c", 4)
    assert Mark("a", "b").text() == "podguard/1 name=a keep=b spec=-"


def test_the_spec_hash_moves_with_what_shapes_the_pod_not_with_the_ready_timeout():
    base = parse_spec(SPEC)
    assert spec_hash(replace(base, ready_timeout_s=5)) == spec_hash(base)
    for change in ({"image": "img:2"}, {"disk_gb": 60}, {"env": {"A": "2"}}, {"args": "run"}):
        assert spec_hash(replace(base, **change)) != spec_hash(base)  # type: ignore[arg-type]


# -- a spec edited since ----------------------------------------------------------------------------------------------
def test_what_changed_since_the_pod_was_made_is_named_never_an_env_value():
    old = parse_spec(SPEC)
    made = pod(marked_spec(old, keep="k1").env)
    assert spec_changes(made, old, None) == [] and spec_changes(None, old, None) == []
    assert spec_changes(pod({}), old, None) == []  # no mark: nothing to compare against
    new = parse_spec({**SPEC, "gpu": {"types": ["NVIDIA A100 80GB PCIe"], "count": 4}, "image": "img:2"})
    said = spec_changes(made, new, None)
    assert said[:3] == ["GPU count 2 -> 4", "GPU type NVIDIA A40 -> NVIDIA A100 80GB PCIe", "image img:1 -> img:2"]
    secret = parse_spec({**SPEC, "env": {"A": "s3cr3t"}})
    assert spec_changes(made, secret, None) == ["env A"]
    bigger = parse_spec({**SPEC, "disk_gb": 80, "args": "run", "ports": ["22/tcp", "8888/http"]})
    assert spec_changes(made, bigger, None) == [
        "args 'train' -> 'run'",
        "disk 50 GB -> 80 GB",
        "ports 22/tcp -> 22/tcp, 8888/http",
    ]
    same_shape = replace(old, template="other")  # a change that shapes nothing the pod shows
    assert spec_changes(made, same_shape, None) == ["the spec (its hash; nothing the pod shows)"]
    cluster = parse_spec({**SPEC, "cluster": {"nodes": 4}})
    assert "nodes 2 -> 4" in spec_changes(made, cluster, 2)


# -- decide: crash loops, unknown statuses, the preflight line ------------------------------------------------------
PASS = read_line("podguard train: PASS on 2 GPU(s) in 842 ms")
RESTART = read_line("podguard train: RESTART 1 of 2 in 3 s after exit 1")
BOOTING = Observed(R, {0: NodeState(R, True)})


def boots(n: int, *, at: float = 0.0, announced: bool = False) -> JobView:
    view = JobView()
    for i in range(n):
        if announced and i:
            view.take(0, RESTART, at + i)  # an in-pod relaunch: its preflight is no container start
        view.take(0, PASS, at + i)
    return view


def test_a_container_started_again_and_again_is_a_crash_loop_an_in_pod_relaunch_is_not():
    assert decide(BOOTING, boots(CRASH_RESTARTS), now=10.0, quiet_since={}, silence_s=900).act is Act.WAIT
    looped = decide(BOOTING, boots(CRASH_RESTARTS + 1), now=10.0, quiet_since={}, silence_s=900)
    assert looped.act is Act.FINISH and looped.reason == Outcome.CRASH_LOOP.value
    assert f"started again {CRASH_RESTARTS} times within 10m" in looped.detail and "the pod" in looped.detail
    later = decide(BOOTING, boots(CRASH_RESTARTS + 1), now=CRASH_WINDOW_S + 1.5, quiet_since={}, silence_s=900)
    assert later.act is Act.WAIT  # the first two boots are older than the window
    relaunches = boots(CRASH_RESTARTS + 3, announced=True)
    assert decide(BOOTING, relaunches, now=10.0, quiet_since={}, silence_s=900).act is Act.WAIT
    view = boots(CRASH_RESTARTS + 1)
    view.after_recovery(replaced=False)  # a start the keeper made: the count starts again
    assert view.node(0).boots == [] and not view.node(0).preflight and not view.node(0).announced


def test_lines_but_no_preflight_within_the_ready_timeout_is_a_crash_loop():
    view = JobView()
    view.node(0).lines = view.node(0).ran = True  # it prints: an exec error, again and again
    early = decide(BOOTING, view, now=10.0, quiet_since={0: 10.0}, silence_s=900, booting_since=0.0, ready_s=30)
    assert early.act is Act.WAIT
    late = decide(BOOTING, view, now=30.0, quiet_since={0: 30.0}, silence_s=900, booting_since=0.0, ready_s=30)
    assert late.act is Act.FINISH and late.reason == "crash-loop" and "within 30s ([ready] timeout_s)" in late.detail
    view.take(0, PASS, 29.0)  # the preflight came: not a crash loop
    assert decide(BOOTING, view, now=30.0, quiet_since={}, silence_s=900, booting_since=0.0, ready_s=30).act is Act.WAIT
    silent = JobView()
    silent.node(0).ran = True  # a runtime but not one line: not a crash loop, and it did start
    assert decide(BOOTING, silent, now=30.0, quiet_since={}, silence_s=900, booting_since=0.0, ready_s=30).act is (
        Act.WAIT
    )


def test_an_unknown_status_is_read_again_never_error():
    unknown = Observed(U, {0: NodeState(U, None)})
    decision = decide(unknown, JobView(), now=0.0, quiet_since={}, silence_s=900)
    assert decision.act is Act.WAIT and "read again" in decision.reason
    assert decide(Observed(E, {0: NodeState(E)}), JobView(), now=0.0, quiet_since={}, silence_s=900).act is Act.REPLACE


def test_a_preflight_line_counts_as_a_boot_and_is_kept_across_the_view():
    view = JobView()
    view.take(0, PASS, 5.0)
    assert view.node(0).preflight and view.node(0).boots == [5.0]
    view.take(0, RESTART, 6.0)
    assert view.node(0).announced
    view.take(0, PASS, 7.0)
    assert view.node(0).boots == [5.0] and not view.node(0).announced


def test_only_what_can_be_compared_is_named():
    old = parse_spec(SPEC)
    made_env = marked_spec(old, keep="k1").env
    heal = {**made_env, ENV_MARK: Mark(name_hash("trainer"), "heal", "", 2).text()}  # a mark with no spec hash
    new = parse_spec({**SPEC, "gpu": {"types": ["NVIDIA A100 80GB PCIe"], "count": 4}, "image": "img:2"})
    assert spec_changes(pod(heal), new, None) == []  # made without a spec: nothing to compare against
    no_gpus = {**made_env, ENV_MARK: Mark(name_hash("trainer"), "k1", "x", None).text()}
    assert "GPU count" not in " ".join(spec_changes(pod(no_gpus), new, None))  # not known what it was made with
    cpu = parse_spec({**{k: v for k, v in SPEC.items() if k != "gpu"}, "cpu": {"id": "cpu3c", "vcpus": 2}})
    assert not [c for c in spec_changes(pod(made_env), cpu, None) if c.startswith("GPU")]  # no GPUs asked
    cpu_pod = Pod("p1", "trainer", R, None, 0.1, None, (), (), image="img:1", args="train", env=made_env)
    assert not [c for c in spec_changes(cpu_pod, new, None) if c.startswith("GPU type")]  # a pod without GPUs
    bare = Pod("p1", "trainer", R, GpuInfo("NVIDIA A40", 2), 0.9, None, (), (), args="train", env=made_env)
    assert spec_changes(bare, parse_spec({**SPEC, "env": {"A": "2"}}), None) == ["env A"]  # image, disk, ports unknown
    cluster = parse_spec({**SPEC, "cluster": {"nodes": 4}})
    assert not [c for c in spec_changes(pod(made_env), cluster, None) if c.startswith("nodes")]  # count not known
    assert not [c for c in spec_changes(pod(made_env), cluster, 4) if c.startswith("nodes")]  # the same count
    assert not [c for c in spec_changes(pod(made_env), new, 2) if c.startswith("nodes")]  # a pod spec: no nodes


def test_env_changes_are_named_sorted_by_name():
    old = parse_spec({**SPEC, "env": {"B": "1", "A": "1"}})
    made = pod(marked_spec(old, keep="k1").env)
    assert spec_changes(made, parse_spec({**SPEC, "env": {"B": "2", "A": "2"}}), None) == ["env A, B"]


# -- decide: the edges of each rule -------------------------------------------------------------------------------
def test_the_names_of_acts_and_outcomes_as_events_and_records_spell_them():
    assert [a.value for a in Act] == ["wait", "start", "replace", "finish"]
    assert [o.value for o in Outcome] == ["success", "guard", "failed", "crash-loop"]
    assert (JobView().code, JobView().detail, JobView().outcome) == (0, "", None)
    assert Decision(Act.WAIT).detail == "" and Decision(Act.WAIT).reason == ""


def test_the_crash_window_counts_five_restarts_within_ten_minutes_to_the_second():
    view = JobView()
    for t in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0):  # a start and five restarts
        view.take(0, PASS, t)
    assert decide(BOOTING, view, now=600.0, quiet_since={}, silence_s=900).act is Act.FINISH  # the first: 600 s ago
    assert decide(BOOTING, view, now=600.5, quiet_since={}, silence_s=900).act is Act.WAIT  # now outside: 4 restarts
    four = JobView()
    for t in (0.0, 1.0, 2.0, 3.0, 4.0):
        four.take(0, PASS, t)
    assert decide(BOOTING, four, now=5.0, quiet_since={}, silence_s=900).act is Act.WAIT
    untimed = JobView()
    untimed.take(0, PASS)
    assert untimed.node(0).boots == [0.0]


def test_a_recovery_forgets_the_old_jobs_end():
    view = JobView()
    view.take(0, read_line("podguard train: END failed exit 3 after 1 attempt(s)"))
    assert (view.outcome, view.code) == (Outcome.FAILED, 3) and view.detail
    view.after_recovery(replaced=False)
    assert (view.outcome, view.code, view.detail) == (None, 0, "")


def test_an_unknown_status_is_read_again_in_those_words():
    unknown = Observed(U, {0: NodeState(U, None)})
    assert decide(unknown, JobView(), now=0.0, quiet_since={}, silence_s=900).reason == (
        "its status is not one the keeper knows: read again"
    )


def test_a_node_in_an_unknown_state_is_never_a_lost_host_a_crash_loop_or_a_late_start():
    quiet = Observed(R, {0: NodeState(R, True), 1: NodeState(U, False)}, cluster=True)
    view = JobView()
    view.node(1).ran = view.node(1).lines = True
    decided = decide(quiet, view, now=5000.0, quiet_since={1: 0.0}, silence_s=900, booting_since=0.0, ready_s=30)
    assert decided.act is Act.WAIT  # unknown: read again
    late = decide(quiet, JobView(), now=5000.0, quiet_since={}, silence_s=900, booting_since=0.0, ready_s=30)
    assert late.act is Act.WAIT
    failed = JobView()
    failed.take(0, read_line("podguard train: END failed exit 1 after 1 attempt(s)"))
    assert decide(quiet, failed, now=0.0, quiet_since={}, silence_s=900).act is Act.FINISH  # not a lost peer


def test_a_node_whose_preflight_came_did_start():
    view = JobView()
    view.node(0).preflight = True
    booting = Observed(R, {0: NodeState(R, False)})
    assert decide(booting, view, now=40.0, quiet_since={}, silence_s=900, booting_since=0.0, ready_s=30).act is (
        Act.WAIT
    )


def test_a_pods_own_failure_is_never_a_lost_peer():
    view = JobView()
    view.outcome, view.code = Outcome.FAILED, 2  # (as if no node had said END: only a cluster has peers)
    gone = Observed(E, {0: NodeState(E)})
    assert decide(gone, view, now=0.0, quiet_since={}, silence_s=900) == Decision(Act.FINISH, "failed")


def test_lost_peers_are_named_in_rank_order():
    nodes = {r: NodeState(R, True) for r in range(9)}
    nodes[8], nodes[1] = NodeState(E), NodeState(E)
    view = JobView()
    view.take(0, read_line("podguard train: END failed exit 1 after 1 attempt(s)"))
    decision = decide(Observed(R, nodes, cluster=True), view, now=0.0, quiet_since={}, silence_s=900)
    assert decision.act is Act.REPLACE and "while node1, node8 was lost" in decision.reason
