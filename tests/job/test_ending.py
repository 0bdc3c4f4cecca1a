"""The END line's vocabulary (one enum, shared with the keeper's reader), its exit codes (one name each), and its
one emitter (job/ending.py): exactly one END line per run, whichever way the run ends."""

from __future__ import annotations

from enum import Enum

import pytest

from podguard import console
from podguard.errors import ExitCode, PodguardError, SharedExit, UsageError
from podguard.job.ending import EndOfRun, refused_in_pod
from podguard.job.restarts import Failure, FailureKind
from podguard.outcome_lines import END_CODES, KINDS, EndKind, end_line
from podguard.pods.keeper.lines import CueKind, read_line


def test_each_end_kind_has_exactly_one_exit_code_and_name():
    assert set(END_CODES) == set(EndKind) and tuple(k.value for k in EndKind) == KINDS
    fixed = {kind: code for kind, code in END_CODES.items() if code is not None}
    assert set(fixed) == {EndKind.SUCCESS, EndKind.HUNG, EndKind.GPU_FAULT, EndKind.GUARD}
    names = {kind: code.name for kind, code in fixed.items()}  # type: ignore[union-attr]
    assert names == {
        EndKind.SUCCESS: "OK",
        EndKind.HUNG: "HUNG",
        EndKind.GPU_FAULT: "GPU_UNHEALTHY",
        EndKind.GUARD: "BILLING_GUARD",
    }
    assert len(set(names.values())) == len(names) and len(set(fixed.values())) == len(fixed)


def test_the_billing_guard_has_its_own_name_not_the_roles_timeout():
    assert ExitCode.BILLING_GUARD.name == "BILLING_GUARD" and ExitCode.BILLING_GUARD == 124
    assert ExitCode.READY_TIMEOUT.name == "READY_TIMEOUT" and ExitCode(124) is ExitCode.READY_TIMEOUT
    assert isinstance(ExitCode.BILLING_GUARD, int) and int(ExitCode.BILLING_GUARD) == 124
    assert ExitCode.BILLING_GUARD is SharedExit.BILLING_GUARD
    assert list(ExitCode.__members__) == [code.name for code in ExitCode]  # no aliases: one name per number


def test_a_failure_kind_maps_to_one_end_kind():
    ends = {kind: kind.end_kind for kind in FailureKind}
    assert ends == {
        FailureKind.CRASH: EndKind.FAILED,
        FailureKind.HANG: EndKind.HUNG,
        FailureKind.GPU_FAULT: EndKind.GPU_FAULT,
    }
    assert Failure(76, FailureKind.GPU_FAULT, "GPU 3 Xid 79", progressed=False).text == "gpu fault (GPU 3 Xid 79)"


def test_the_keeper_reads_the_kind_as_the_enum():
    for kind in EndKind:
        cue = read_line(end_line("train", kind, 0, 1, "x"))
        assert cue is not None and cue.kind is CueKind.END and cue.word is kind
    with pytest.raises(ValueError, match="unknown end kind"):
        end_line("train", "gpu_fault", 76, 1, "")  # the failure's word is not an END kind


def test_the_error_carries_no_end_flag():
    """The END line is the emitter's business, not a mutable flag on the exception the CLI prints."""
    assert not hasattr(UsageError("x"), "end_said") and not hasattr(PodguardError("x"), "end_said")
    assert issubclass(EndKind, Enum)


# -- the emitter ---------------------------------------------------------------------------------------------------


def _ends(lines: list[str]) -> list[str]:
    return [line for line in lines if ": END " in line]


def test_an_outcome_is_said_once_and_a_second_is_a_bug():
    end = EndOfRun("train")
    end.attempts = 2
    with console.captured() as lines:
        end.say(EndKind.SUCCESS, 0, "job finished")
        with pytest.raises(AssertionError, match="END said twice"):
            end.say(EndKind.FAILED, 1)
    assert lines == ["podguard train: END success exit 0 after 2 attempt(s): job finished"]


@pytest.mark.parametrize(("started", "pod", "said"), [(False, "", 0), (False, "p1", 1), (True, "", 1), (True, "p1", 1)])
def test_an_error_that_escapes_the_run_says_end_preflight(monkeypatch, started, pod, said):
    """Refused before the run began: END inside a pod only (a keeper reads it); once it began: always."""
    monkeypatch.setenv("RUNPOD_POD_ID", pod)
    end = EndOfRun("run")
    with console.captured() as lines, pytest.raises(UsageError), end.around():
        end.started = started
        raise UsageError("--prepare is empty")
    assert _ends(lines) == ["podguard run: END preflight exit 64 after 0 attempt(s): --prepare is empty"][:said]


def test_an_error_after_the_outcome_adds_no_second_end(monkeypatch):
    monkeypatch.setenv("RUNPOD_POD_ID", "p1")
    end = EndOfRun("train")
    with console.captured() as lines, pytest.raises(PodguardError), end.around():
        end.started = True
        end.say(EndKind.SUCCESS, 0)
        raise PodguardError("--on-exit stop-pod: the API refused", ExitCode.API_ACCESS)
    assert _ends(lines) == ["podguard train: END success exit 0 after 0 attempt(s)"]


def test_a_command_line_refused_before_the_conductor_says_end_in_a_pod_only(monkeypatch):
    monkeypatch.delenv("RUNPOD_POD_ID", raising=False)
    with console.captured() as lines:
        refused_in_pod("train", 64, "no such option: --x")
    assert lines == []
    monkeypatch.setenv("RUNPOD_POD_ID", "p1")
    with console.captured() as lines:
        refused_in_pod("train", 64, "no such option: --x")
    assert lines == ["podguard train: END preflight exit 64 after 0 attempt(s): no such option: --x"]
