"""The keeper's reading of podguard's lines and its decision table (pure: no process, no HTTP)."""

from __future__ import annotations

import pytest

from podguard.outcome_lines import end_line, restart_line
from podguard.pods.keeper.decide import Act, JobView, NodeState, Observed, Outcome, decide
from podguard.pods.keeper.lines import CueKind, read_line
from podguard.pods.pod import PodStatus

RUNNING = Observed(PodStatus.RUNNING, {0: NodeState(PodStatus.RUNNING, True)})


def seen(*lines: str, rank: int = 0, view: JobView | None = None) -> JobView:
    view = view or JobView()
    for line in lines:
        cue = read_line(line)
        assert cue is not None, line
        view.take(rank, cue)
    return view


def act(observed: Observed, view: JobView, *, quiet_for: float = 0.0, silence_s: float = 900.0) -> Act:
    quiet = {r: 1000.0 - quiet_for for r in observed.nodes}
    return decide(observed, view, now=1000.0, quiet_since=quiet, silence_s=silence_s).act


def ran(rank: int = 0) -> JobView:
    """A view of a pod that was seen running its container since its last start."""
    view = JobView()
    view.node(rank).ran = True
    return view


def test_the_lines_are_read_as_outcome_lines_writes_them():
    end = read_line(end_line("train", "failed", 3, 2, "worker 0 exited 3"))
    assert end is not None and (end.kind, end.word, end.code) == (CueKind.END, "failed", 3)
    restart = read_line(restart_line("run", 1, 3, 1.0, "crash (exit 1)", 1))
    assert restart is not None and (restart.kind, restart.word) == (CueKind.RESTART, "1 of 3")
    verdict = read_line("podguard train: UNHEALTHY on 8 GPU(s) in 1311 ms")
    assert verdict is not None and (verdict.kind, verdict.word) == (CueKind.VERDICT, "UNHEALTHY")
    guard = read_line("podguard: billing guard --max-cost: spent $150.00 (limit $150); stopping 8 worker(s)")
    assert guard is not None and (guard.kind, guard.word) == (CueKind.GUARD, "--max-cost")


@pytest.mark.parametrize(
    "line",
    [
        "step 10: podguard train: END success exit 0 after 1 attempt(s)",  # not at the start: the job's own text
        "podguard train: END sucess exit 0 after 1 attempt(s)",  # not a kind
        "podguard: cleanup: no process holds the selected GPUs",
        "podguard train: PASSED",
        "",
    ],
)
def test_other_lines_are_not_cues(line):
    assert read_line(line) is None


def test_outcomes_success_guard_failure_and_what_is_not_one():
    assert seen("podguard train: END success exit 0 after 1 attempt(s)").outcome is Outcome.SUCCESS
    assert seen("podguard run: END guard exit 124 after 1 attempt(s): --idle-stop").outcome is Outcome.GUARD
    hung = seen("podguard train: END hung exit 79 after 3 attempt(s)")
    assert (hung.outcome, hung.code) == (Outcome.FAILED, 79)
    assert seen("podguard train: END signal exit 143 after 1 attempt(s)").outcome is None
    assert seen("podguard train: END preflight exit 76 after 1 attempt(s)").outcome is None
    assert seen("podguard train: END preflight exit 64 after 1 attempt(s)").outcome is Outcome.FAILED
    fault = seen("podguard train: END gpu-fault exit 76 after 1 attempt(s)")
    assert fault.outcome is None and act(RUNNING, fault) is Act.REPLACE


def test_the_first_outcome_stands():
    view = seen(
        "podguard train: END failed exit 2 after 1 attempt(s)", "podguard train: END success exit 0 after 1 attempt(s)"
    )
    assert (view.outcome, view.code) == (Outcome.FAILED, 2)


def test_status_decisions():
    view = JobView()
    assert act(RUNNING, view) is Act.WAIT
    assert act(Observed(PodStatus.EXITED, {0: NodeState(PodStatus.EXITED)}), view) is Act.START
    assert act(Observed(PodStatus.ERROR, {0: NodeState(PodStatus.ERROR)}), view) is Act.REPLACE
    assert act(Observed(None, {0: NodeState(None)}), view) is Act.REPLACE
    assert act(Observed(PodStatus.PROVISIONING, {0: NodeState(PodStatus.PROVISIONING)}), view) is Act.WAIT
    lost = Observed(PodStatus.RUNNING, {0: NodeState(PodStatus.RUNNING, False)})
    assert act(lost, ran(), quiet_for=899) is Act.WAIT
    assert act(lost, ran(), quiet_for=900) is Act.REPLACE
    assert act(RUNNING, view, quiet_for=10_000) is Act.WAIT  # a quiet job on a live host is left alone


def test_after_a_guard_line_a_stopped_or_gone_pod_is_the_guard_not_a_recovery():
    view = seen("podguard: billing guard --idle-stop: every GPU at or below 5 % utilisation for 30m")
    for observed in (Observed(PodStatus.EXITED), Observed(PodStatus.ERROR), Observed(None)):
        decision = decide(observed, view, now=0.0, quiet_since={}, silence_s=900)
        assert (decision.act, decision.reason) == (Act.FINISH, "guard")


def test_three_failed_preflights_in_a_row_replace_a_pass_resets_the_count():
    unhealthy = "podguard train: UNHEALTHY on 2 GPU(s) in 1311 ms"
    passed = "podguard train: PASS on 2 GPU(s) in 842 ms"
    assert act(RUNNING, seen(unhealthy, unhealthy)) is Act.WAIT
    assert act(RUNNING, seen(unhealthy, unhealthy, passed, unhealthy)) is Act.WAIT
    view = seen(unhealthy, "podguard train: FAIL on 2 GPU(s)", "podguard train: BUSY on 2 GPU(s)")
    assert act(RUNNING, view) is Act.REPLACE
    view.after_recovery(replaced=False)  # a start is the same machine: it keeps counting
    assert act(RUNNING, view) is Act.REPLACE
    view.after_recovery(replaced=True)
    assert act(RUNNING, view) is Act.WAIT


def test_a_cluster_ends_on_node_0s_success_and_any_nodes_failure():
    cluster = Observed(
        PodStatus.RUNNING, {0: NodeState(PodStatus.RUNNING), 1: NodeState(PodStatus.RUNNING)}, cluster=True
    )
    view = seen("podguard train: END success exit 0 after 1 attempt(s)", rank=1)
    assert act(cluster, view) is Act.WAIT
    seen("podguard train: END success exit 0 after 1 attempt(s)", rank=0, view=view)
    assert view.outcome is Outcome.SUCCESS
    failed = seen("podguard train: END failed exit 1 after 1 attempt(s)", rank=3)
    assert (failed.outcome, failed.code) == (Outcome.FAILED, 1)
    lost = Observed(PodStatus.ERROR, {0: NodeState(PodStatus.RUNNING), 1: NodeState(PodStatus.ERROR)}, True, (1,))
    decision = decide(lost, JobView(), now=0.0, quiet_since={}, silence_s=900)
    assert decision.act is Act.REPLACE and "node1 (ERROR)" in decision.reason
    exited = Observed(PodStatus.EXITED, {1: NodeState(PodStatus.EXITED)}, True, (1,))
    assert act(exited, JobView()) is Act.REPLACE  # a cluster is never started, only replaced whole


def test_a_cluster_failure_after_a_lost_peer_is_a_replacement_not_the_jobs_failure():
    failed = seen("podguard train: END failed exit 1 after 1 attempt(s)", rank=0)
    healthy = Observed(
        PodStatus.RUNNING, {0: NodeState(PodStatus.RUNNING, True), 1: NodeState(PodStatus.RUNNING, True)}, True
    )
    assert act(healthy, failed) is Act.FINISH
    peer_lost = Observed(
        PodStatus.RUNNING, {0: NodeState(PodStatus.RUNNING, True), 1: NodeState(PodStatus.RUNNING, False)}, True
    )
    decision = decide(peer_lost, failed, now=0.0, quiet_since={}, silence_s=900)
    assert decision.act is Act.REPLACE and "node1 was lost" in decision.reason
    both = seen("podguard train: END failed exit 1 after 1 attempt(s)", rank=1, view=failed)
    assert act(peer_lost, both) is Act.FINISH  # node 1 printed its own end: it ran the job and failed with it
    failed.after_recovery(replaced=True)
    assert failed.outcome is None and not failed.ended


def test_the_silence_rule_holds_for_graphql_statuses_of_a_pod_meant_to_run():
    for status in (PodStatus.STARTING, PodStatus.PROVISIONING):
        lost = Observed(status, {0: NodeState(status, False)})
        assert act(lost, ran(), quiet_for=900) is Act.REPLACE
        assert act(Observed(status, {0: NodeState(status, None)}), ran(), quiet_for=900) is Act.WAIT


@pytest.mark.parametrize(
    ("status", "says"),
    [(PodStatus.PROVISIONING, "still PROVISIONING"), (PodStatus.RUNNING, "RUNNING with no container")],
)
def test_a_pod_never_seen_running_its_container_falls_under_the_ready_timeout_not_the_silence(status, says):
    booting = Observed(status, {0: NodeState(status, False)})
    quiet = {0: 0.0}
    early = decide(booting, JobView(), now=1000.0, quiet_since=quiet, silence_s=900, booting_since=0.0, ready_s=1800)
    assert early.act is Act.WAIT  # a slow image pull is not a lost host
    late = decide(booting, JobView(), now=1800.0, quiet_since=quiet, silence_s=900, booting_since=0.0, ready_s=1800)
    assert late.act is Act.REPLACE and "did not start within 30m ([ready] timeout_s)" in late.reason
    assert late.reason.endswith(": " + says)


def test_a_pod_started_with_fewer_gpus_than_its_spec_is_the_hosts_problem():
    short = Observed(PodStatus.RUNNING, {0: NodeState(PodStatus.RUNNING, True, (0, 2))})
    decision = decide(short, JobView(), now=0.0, quiet_since={}, silence_s=900)
    assert decision.act is Act.REPLACE and "with 0 of its 2 GPU(s)" in decision.reason
    view = seen("podguard train: END preflight exit 69 after 1 attempt(s)")
    assert view.outcome is None and act(RUNNING, view) is Act.REPLACE
    view.after_recovery(replaced=True)
    assert act(RUNNING, view) is Act.WAIT


def test_the_end_line_stays_under_400_characters_and_its_checkpoint_is_read_back():
    from podguard.outcome_lines import newest_checkpoint

    fragment = "newest checkpoint /workspace/ckpt/checkpoint-1200 (step 1200, written 2026-11-27T08:00:00Z)"
    line = end_line("train", "gpu-fault", 76, 2, fragment + "; " + "straggler rank 3 " * 100)
    assert len(line) < 400 and line.endswith("…") and "\n" not in line
    assert read_line(line) is not None
    found = newest_checkpoint(line)
    assert found is not None and (found.name, found.step) == ("checkpoint-1200", 1200)
    assert newest_checkpoint("newest checkpoint /w/ckpt.pt (written 2026-11-27T08:00:00Z)").step is None
    assert newest_checkpoint("job finished") is None
    spaced = newest_checkpoint(  # a checkpoint dir with a space in its path is read whole
        "newest checkpoint /workspace/my run/checkpoint-7 (step 7, written 2026-11-27T08:00:00Z); started from scratch"
    )
    assert spaced is not None and (spaced.path, spaced.step) == ("/workspace/my run/checkpoint-7", 7)
    wide = end_line("run", "failed", 3, 1, "損失が発散しました\u2028" * 80)  # characters, not bytes; one line
    assert len(wide) == 399 and wide.endswith("…") and len(wide.splitlines()) == 1
    cue = read_line(wide)
    assert cue is not None and (cue.kind, cue.word, cue.code) == (CueKind.END, "failed", 3)


def test_graphql_pods_tell_whether_a_container_runs():
    from podguard.pods.graphql_api import pod_from_graphql

    base = {"id": "p1", "name": "x", "desiredStatus": "RUNNING", "machineId": "m1"}
    assert pod_from_graphql({**base, "runtime": None}).has_runtime is False
    assert pod_from_graphql({**base, "runtime": {"uptimeInSeconds": 5, "ports": []}}).has_runtime is True
    assert pod_from_graphql(base).has_runtime is None


# -- the cases mutation testing (shared/tools/mutate.py on decide.py) showed untested ------------------------------
@pytest.mark.parametrize("status", [PodStatus.EXITED, PodStatus.ERROR, PodStatus.TERMINATED, None])
def test_a_cluster_failure_after_a_peer_stopped_errored_or_went_is_a_replacement(status):
    failed = seen("podguard train: END failed exit 1 after 1 attempt(s)", rank=0)
    observed = Observed(PodStatus.RUNNING, {0: NodeState(PodStatus.RUNNING, True), 1: NodeState(status)}, True)
    decision = decide(observed, failed, now=0.0, quiet_since={}, silence_s=900)
    assert decision.act is Act.REPLACE and "node1 was lost" in decision.reason


def test_a_cluster_is_replaced_on_a_stopped_aggregate_or_a_lost_node_alone_and_a_guard_wins_over_both():
    stopped = Observed(PodStatus.EXITED, {}, cluster=True)
    lost = Observed(PodStatus.RUNNING, {0: NodeState(PodStatus.RUNNING, True)}, cluster=True, lost=(1,))
    for observed in (stopped, lost):
        decision = decide(observed, JobView(), now=0.0, quiet_since={}, silence_s=900)
        assert (decision.act, decision.settle) == (Act.REPLACE, True)
        assert "a cluster is replaced whole" in decision.reason
    guard = seen("podguard: billing guard --max-cost: spent $150.00 (limit $150); stopping 8 worker(s)")
    assert decide(lost, guard, now=0.0, quiet_since={}, silence_s=900).reason == "guard"


def test_a_terminated_pod_is_gone_and_a_pods_reasons_name_the_pod():
    gone = decide(Observed(PodStatus.TERMINATED), JobView(), now=0.0, quiet_since={}, silence_s=900)
    assert gone.act is Act.REPLACE and "gone" in gone.reason
    fault = seen("podguard train: END gpu-fault exit 76 after 1 attempt(s)")
    assert decide(RUNNING, fault, now=0.0, quiet_since={}, silence_s=900).reason.endswith("on the pod")
    lost = Observed(PodStatus.RUNNING, {0: NodeState(PodStatus.RUNNING, False)})
    silent = decide(lost, ran(), now=1000.0, quiet_since={0: 0.0}, silence_s=900)
    assert "on the pod (its host is lost)" in silent.reason and silent.settle is False
    waiting = decide(RUNNING, JobView(), now=0.0, quiet_since={}, silence_s=900)
    assert (waiting.act, waiting.reason, waiting.settle) == (Act.WAIT, "", False)


def test_the_ready_timeout_spares_a_node_that_ran_or_has_a_runtime_and_covers_an_unlisted_cluster():
    def late(observed: Observed, view: JobView) -> Act:
        return decide(observed, view, now=100.0, quiet_since={}, silence_s=900, booting_since=0.0, ready_s=10).act

    assert late(RUNNING, JobView()) is Act.WAIT  # a runtime: the container runs
    assert late(Observed(PodStatus.RUNNING, {0: NodeState(PodStatus.RUNNING, False)}), ran()) is Act.WAIT
    assert late(Observed(PodStatus.RUNNING, {0: NodeState(PodStatus.RUNNING, None)}), JobView()) is Act.WAIT
    booting = Observed(PodStatus.PROVISIONING, {}, cluster=True)  # members never listed yet
    assert late(booting, JobView()) is Act.REPLACE
    assert late(Observed(PodStatus.RUNNING, {}, cluster=True), JobView()) is Act.WAIT
    assert late(Observed(PodStatus.PROVISIONING, {0: NodeState(PodStatus.PROVISIONING, True)}), JobView()) is Act.WAIT


def test_a_short_node_is_named_in_rank_order():
    short = Observed(
        PodStatus.RUNNING,
        {1: NodeState(PodStatus.RUNNING, True, (0, 8)), 0: NodeState(PodStatus.RUNNING, True, (4, 8))},
        cluster=True,
    )
    reason = decide(short, JobView(), now=0.0, quiet_since={}, silence_s=900).reason
    assert "node0 with 4 of its 8 GPU(s)" in reason


def test_what_the_lines_say_in_words_and_a_recovery_forgets_the_guard():
    view = JobView()
    assert not view.node(0).passed  # the keeper's status line says "waiting for the preflight"
    assert view.take(0, read_line("podguard train: PASS on 2 GPU(s) in 842 ms")) == "preflight PASS: the job runs"
    assert view.node(0).passed
    restart = read_line(restart_line("train", 1, 3, 1.0, "crash (exit 1)", 1))
    assert view.take(0, restart) == "in-pod restart 1 of 3 (the job relaunches itself; not the end)"
    seen("podguard: billing guard --idle-stop: every GPU at or below 5 % utilisation for 30m", view=view)
    view.after_recovery(replaced=False)
    assert act(Observed(PodStatus.EXITED, {0: NodeState(PodStatus.EXITED)}), view) is Act.START


def test_status_only_decisions_settle_first_and_say_why():
    view = JobView()
    cases = [
        (Observed(PodStatus.EXITED, {0: NodeState(PodStatus.EXITED)}), Act.START, "EXITED without an outcome"),
        (Observed(PodStatus.ERROR, {0: NodeState(PodStatus.ERROR)}), Act.REPLACE, "in ERROR"),
        (Observed(None), Act.REPLACE, "it is gone (no longer in the API)"),
    ]
    for observed, what, why in cases:
        decision = decide(observed, view, now=0.0, quiet_since={}, silence_s=900)
        assert (decision.act, decision.settle) == (what, True) and decision.reason.startswith(why)
    guard = seen("podguard: billing guard --idle-stop: every GPU at or below 5 % utilisation for 30m")
    for observed in [*(c[0] for c in cases), Observed(PodStatus.EXITED, {}, cluster=True)]:
        decision = decide(observed, guard, now=0.0, quiet_since={}, silence_s=900)
        assert (decision.act, decision.reason, decision.settle) == (Act.FINISH, "guard", True)


def test_the_words_for_each_end_and_the_streak_after_a_pass_or_a_replacement():
    view = JobView()
    assert view.take(0, read_line("podguard run: END guard exit 124 after 1 attempt(s)")) == (
        "END guard: a billing guard ended the job"
    )
    assert JobView().take(0, read_line("podguard train: END success exit 0 after 1 attempt(s)")) == (
        "END success: the job is over"
    )
    short = JobView().take(0, read_line("podguard train: END preflight exit 69 after 1 attempt(s)"))
    assert short is not None and "fewer GPUs" in short
    refused = JobView().take(0, read_line("podguard train: END preflight exit 64 after 1 attempt(s)"))
    assert refused == "the pod refuses its own configuration (exit 64)"
    unhealthy = "podguard train: UNHEALTHY on 2 GPU(s) in 1311 ms"
    assert act(RUNNING, seen("podguard train: PASS on 2 GPU(s) in 842 ms", unhealthy, unhealthy)) is Act.WAIT
    sick = seen(unhealthy, unhealthy, unhealthy)
    sick.after_recovery(replaced=True)
    assert not sick.node(0).passed and act(RUNNING, seen(unhealthy, unhealthy, view=sick)) is Act.WAIT


def test_a_cluster_success_with_a_lost_peer_is_still_the_end():
    done = seen("podguard train: END success exit 0 after 1 attempt(s)", rank=0)
    peer_lost = Observed(
        PodStatus.RUNNING, {0: NodeState(PodStatus.RUNNING, True), 1: NodeState(PodStatus.RUNNING, False)}, True
    )
    assert decide(peer_lost, done, now=0.0, quiet_since={}, silence_s=900).act is Act.FINISH


def test_the_ready_timeout_counts_from_the_start_and_names_the_nodes():
    booting = Observed(PodStatus.PROVISIONING, {0: NodeState(PodStatus.PROVISIONING, None)})
    early = decide(booting, JobView(), now=55.0, quiet_since={}, silence_s=900, booting_since=50.0, ready_s=10)
    assert early.act is Act.WAIT
    late = decide(booting, JobView(), now=61.0, quiet_since={}, silence_s=900, booting_since=50.0, ready_s=10)
    assert late.act is Act.REPLACE and "still PROVISIONING" in late.reason
    unlisted = Observed(PodStatus.STARTING, {}, cluster=True)
    named = decide(unlisted, JobView(), now=61.0, quiet_since={}, silence_s=900, booting_since=50.0, ready_s=10)
    assert named.reason.startswith("node0 did not start within")
    two = Observed(
        PodStatus.PROVISIONING,
        {0: NodeState(PodStatus.PROVISIONING, False), 2: NodeState(PodStatus.PROVISIONING, False)},
        cluster=True,
    )
    both = decide(two, JobView(), now=61.0, quiet_since={}, silence_s=900, booting_since=50.0, ready_s=10)
    assert both.reason.startswith("node0, node2 did not start within") and "; still" in both.reason


def test_fewer_gpus_count_only_once_the_pod_runs():
    starting = Observed(PodStatus.STARTING, {0: NodeState(PodStatus.STARTING, False, (0, 2))})
    assert act(starting, JobView()) is Act.WAIT


def test_two_lost_nodes_are_named_each_with_its_state():
    lost = Observed(PodStatus.ERROR, {1: NodeState(PodStatus.ERROR)}, cluster=True, lost=(1, 2))
    reason = decide(lost, JobView(), now=0.0, quiet_since={}, silence_s=900).reason
    assert reason.startswith("node1 (ERROR), node2 (gone) left RUNNING")
