"""The stuck rank named in real DDP training (issue 23, item 12): waiting in DDP's gradient all-reduce inside
`backward`, and the waits FSDP and DeepSpeed put in backward/step, count as waiting in a collective.

The fixtures are real `py-spy dump --json` output of a 2-rank gloo DDP job on CPU started with
torch.multiprocessing.spawn (stacks_fixtures/ddp_job.py.txt, the exact source): rank 1 sleeps in its "data
loader" before the step, rank 0 waits in backward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podguard.launch.watch import stacks
from podguard.launch.watch.ranks import StackTarget
from podguard.launch.watch.stacks import Frame, RankStacks, hang_summary
from podguard.launch.watch.verdict import BACKWARD_WAIT, collective_of

FIXTURES = Path(__file__).with_name("stacks_fixtures")


def from_fixture(name: str, rank: int, role: str = "rank") -> RankStacks:
    """A rank's RankStacks as capture_stacks builds it from py-spy's JSON."""
    threads = stacks._parse(json.loads((FIXTURES / name).read_text()))
    pid = threads[0].thread_id
    target = StackTarget(pid, rank, rank, None, "single", role)
    user, collective = stacks._where(target, threads)
    return RankStacks(target, None, threads, user, None, 12.0, collective)


def test_a_ddp_rank_waiting_in_backward_names_the_rank_stuck_before_it():
    waiting = from_fixture("ddp_gloo_rank0_backward.json", 0)
    stuck = from_fixture("ddp_gloo_rank1_load_batch.json", 1)
    assert waiting.collective == BACKWARD_WAIT and waiting.innermost_user_frame == "ddp_job.py:19 in train"
    assert stuck.collective is None and stuck.innermost_user_frame == "ddp_job.py:7 in load_batch"
    lines = hang_summary([waiting, stuck])
    assert lines[0] == f"rank 0: ddp_job.py:19 in train (in {BACKWARD_WAIT})"
    assert lines[-1].endswith("rank 1 is the likely stuck rank"), lines  # was: "the ranks are at different places"


def frame(function: str, file: str, line: int = 1) -> Frame:
    return Frame(function, file, line)


SITE = "/usr/lib/python3.11/site-packages"
USER = frame("training_step", "/work/train.py", 40)


@pytest.mark.parametrize(
    ("inner", "expected"),
    [
        ([frame("backward", f"{SITE}/torch/autograd/__init__.py", 251)], BACKWARD_WAIT),  # torch < 2.3
        ([frame("_engine_run_backward", f"{SITE}/torch/autograd/graph.py")], BACKWARD_WAIT),
        ([frame("FullyShardedDataParallel._unshard", f"{SITE}/torch/distributed/fsdp/_runtime_utils.py")], "_unshard"),
        ([frame("foreach_all_gather", f"{SITE}/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py")],
         "foreach_all_gather"),
        ([frame("wait", f"{SITE}/torch/distributed/distributed_c10d.py"),
          frame("DeepSpeedZeroOptimizer.average_tensor", f"{SITE}/deepspeed/runtime/zero/stage_1_and_2.py"),
          frame("DeepSpeedEngine.backward", f"{SITE}/deepspeed/runtime/engine.py")], "average_tensor"),
        ([frame("all_reduce", f"{SITE}/deepspeed/comm/comm.py")], "all_reduce"),
        ([frame("_sync_buffers", f"{SITE}/torch/nn/parallel/distributed.py")], "_sync_buffers"),
        ([frame("Tensor.backward", f"{SITE}/torch/_tensor.py"), frame("matmul", f"{SITE}/numpy/core.py")], None),
        ([frame("all_reduce", "/work/my_helpers.py")], None),  # the user's own function of that name: not torch's
    ],
)  # fmt: skip
def test_framework_waits_count_as_waiting_in_a_collective(inner, expected):
    frames = (*inner, USER)
    assert collective_of(frames, len(inner)) == expected


def test_only_ranks_are_compared_other_processes_keep_their_stacks():
    waiting = from_fixture("ddp_gloo_rank0_backward.json", 0)
    stuck = from_fixture("ddp_gloo_rank1_load_batch.json", 1)
    worker = from_fixture("ddp_gloo_rank1_load_batch.json", 0, role="child")  # a data-loader worker of rank 0
    lines = hang_summary([waiting, stuck, worker])
    assert lines[2].endswith("rank 1 is the likely stuck rank") and not any("child" in ln for ln in lines[:3])
    assert lines[-1] == "also kept: the stacks of 1 of 1 other process(es) (child), not compared"


def rank_at(rank: int, *inner: Frame, user: Frame = USER, role: str = "rank") -> RankStacks:
    """A rank whose main thread is in `inner` (innermost first) below the user's frame `user`."""
    pid = 1000 + rank
    threads = (stacks.ThreadStack(pid, "MainThread", False, (*inner, user, frame("<module>", "/work/train.py"))),)
    target = StackTarget(pid, rank, rank, None, "torchrun", role)
    where, collective = stacks._where(target, threads)
    return RankStacks(target, None, threads, where, None, 1.0, collective)


BACKWARD = frame("_engine_run_backward", f"{SITE}/torch/autograd/graph.py")
ALL_REDUCE = frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py")
NEXT = (frame("_MultiProcessingDataLoaderIter._next_data", f"{SITE}/torch/utils/data/dataloader.py"),
        frame("_BaseDataLoaderIter.__next__", f"{SITE}/torch/utils/data/dataloader.py"))  # fmt: skip
LOOP = frame("train", "/work/train.py", 30)


def test_all_ranks_in_backwards_all_reduce_name_no_rank():
    lines = hang_summary([rank_at(r, BACKWARD) for r in range(4)])
    assert lines[-1].startswith(f"all 4 ranks wait in {BACKWARD_WAIT}") and "none differs" in lines[-1]
    assert not any("likely stuck" in ln for ln in lines)


def test_one_rank_in_the_data_loader_while_the_others_all_reduce_is_named():
    ranks = [rank_at(0, ALL_REDUCE), rank_at(1, *NEXT, user=LOOP), rank_at(2, ALL_REDUCE), rank_at(3, ALL_REDUCE)]
    assert ranks[1].collective is None  # (the loader's queue waits are not torch.distributed's)
    assert hang_summary(ranks)[-1].endswith("rank 1 is the likely stuck rank")


def test_fsdp_post_backward_waits_and_a_rank_sleeping_in_user_code():
    post = (frame("wait", f"{SITE}/torch/distributed/distributed_c10d.py"),
            frame("_reduce_grad", f"{SITE}/torch/distributed/fsdp/_runtime_utils.py"),
            frame("_post_backward_hook", f"{SITE}/torch/distributed/fsdp/_runtime_utils.py"), BACKWARD)  # fmt: skip
    sleeper = rank_at(2, frame("sleep", "<built-in>"), user=frame("log_metrics", "/work/train.py", 77))
    ranks = [rank_at(0, *post), rank_at(1, *post), sleeper]
    assert ranks[0].collective == "_post_backward_hook"
    assert hang_summary(ranks)[-1].endswith("rank 2 is the likely stuck rank")


def test_most_ranks_outside_a_collective_are_not_all_called_stuck():
    """One rank in a barrier, three at the same `.item()` (NCCL: a GPU wait, no Python collective frame): the three
    are not 'the likely stuck ranks' (the one in the barrier differs)."""
    item = frame("train", "/work/train.py", 52)
    ranks = [rank_at(0, frame("barrier", f"{SITE}/torch/distributed/distributed_c10d.py"))]
    ranks += [rank_at(r, user=item) for r in (1, 2, 3)]
    verdict = hang_summary(ranks)[-1]
    assert "likely stuck" not in verdict and verdict.endswith("rank 0 differs from the rest"), verdict


def test_helpers_and_loader_workers_are_never_ranks_in_the_verdict():
    ranks = [rank_at(0, ALL_REDUCE), rank_at(1, ALL_REDUCE)]
    others = [rank_at(0, *NEXT, user=LOOP, role="child"), rank_at(9, frame("main", "/work/x.py"), role="helper")]
    lines = hang_summary([*ranks, *others])
    assert "none differs" in lines[-2] and not any("likely stuck" in ln for ln in lines)
    assert lines[-1] == "also kept: the stacks of 2 of 2 other process(es) (child, helper), not compared"


def test_ranks_waiting_in_different_collectives_name_no_stuck_rank():
    ranks = [rank_at(0, ALL_REDUCE), rank_at(1, ALL_REDUCE), rank_at(2, BACKWARD)]
    verdict = hang_summary(ranks)[-1]
    assert "likely stuck" not in verdict and verdict.endswith("rank 2 differs from the rest"), verdict
