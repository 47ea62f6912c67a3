"""The analyzer's side group: a collective that finishes late is a success, not a failure of
the group, on a scripted Work and on two Gloo ranks whose second joins each gather about one
poll period late; a gather that never finishes is a failure without anyone waiting for it;
a stop another rank asks for travels in its rows."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch.distributed as dist

from conftest import REAL_RUNS, REPO, torchrun
from relax_straggler.common.payload import ROW_LEN
from relax_straggler.common.side_failure import GATHER_FAILED, GATHER_STUCK, SideFailure
from relax_straggler.live.works import Outcome, outcome


class LateWork:
    """A Work that completes the instant after a limited wait gave up on it: wait(timeout)
    raises c10d's "Operation timed out!" and the work is complete when looked at again.
    error: the work's own failure, raised by wait() once complete."""

    def __init__(self, error: Exception | None = None) -> None:
        self.completed = False
        self.error = error
        self.waits: list = []

    def is_completed(self) -> bool:
        return self.completed

    def wait(self, timeout=None):
        self.waits.append(timeout)
        if not self.completed and timeout is not None:
            self.completed = True  # it finishes just after the limit passed
            raise RuntimeError("Operation timed out!")
        self.completed = True
        if self.error is not None:
            raise self.error
        return True


def test_a_work_that_finishes_right_after_the_limit_succeeded():
    work = LateWork()
    assert outcome(work, 0.05) == (Outcome.SUCCEEDED, None)


def test_a_work_that_failed_is_a_failure_with_its_own_error():
    error = RuntimeError("Connection closed by peer [127.0.0.1]:29500")
    assert outcome(LateWork(error), 0.05) == (Outcome.FAILED, error)


def test_a_running_work_is_only_looked_at_without_a_limit():
    class Running(LateWork):
        def wait(self, timeout=None):
            self.waits.append(timeout)
            raise RuntimeError("Operation timed out!")

    work = Running()
    assert outcome(work) == (Outcome.RUNNING, None) and work.waits == []
    assert outcome(work, 0.01) == (Outcome.RUNNING, None) and len(work.waits) == 1


@pytest.fixture
def one_rank_world(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_report_thread_takes_a_gather_finished_just_after_its_poll_for_rows(one_rank_world):
    from relax_straggler.live.aggregation import SideGroupGather

    side = SideGroupGather([0], metrics_rank=0)
    side.wait_for(LateWork())  # raises GatherUnavailable when the late finish is taken for a failure
    assert side.failure is None
    side.close()


def test_a_gather_that_never_finishes_is_this_ranks_failure_after_the_stall_timeout_never_a_wait(
        one_rank_world, monkeypatch):
    from relax_straggler.live import aggregation
    from relax_straggler.live.aggregation import SideGroupGather

    class Never(LateWork):
        def wait(self, timeout=None):
            time.sleep(timeout.total_seconds())
            raise RuntimeError("Operation timed out!")

    side = SideGroupGather([0], metrics_rank=0)
    monkeypatch.setattr(aggregation, "STALL_TIMEOUT_S", 0.2)
    monkeypatch.setattr(dist, "gather", lambda *args, **kwargs: Never())
    began = time.perf_counter()
    for step in range(3):
        side.gather(np.zeros(ROW_LEN), step=step)
    assert time.perf_counter() - began < 0.1 and side.failure is None
    assert side.oldest_unfinished_step() == 0
    time.sleep(0.25)
    side.poll()
    assert (side.failure.code, side.failure.step) == (GATHER_STUCK, 0), side.failure
    side.close(timeout_s=0.0)


def test_a_gather_unfinished_at_close_is_never_freed(one_rank_world, monkeypatch):
    # Its Work holds its tensors: were the last reference dropped here, Gloo's worker thread
    # would free them when the collective ends, taking the interpreter lock, and a thread
    # that takes it while the interpreter exits aborts the process.
    import gc
    import weakref

    from relax_straggler.live.aggregation import SideGroupGather

    class Never(LateWork):
        def wait(self, timeout=None):
            raise RuntimeError("Operation timed out!")

    side = SideGroupGather([0], metrics_rank=0)
    works = []
    monkeypatch.setattr(dist, "gather", lambda *args, **kwargs: works.append(Never()) or works[-1])
    for step in range(2):
        side.gather(np.zeros(ROW_LEN), step=step)
    kept = [weakref.ref(w) for w in works]
    assert side.close(timeout_s=0.0) is False
    works.clear()
    gc.collect()
    assert all(ref() is not None for ref in kept)


def test_the_metrics_rank_reads_a_stop_another_rank_asks_for_in_its_rows(one_rank_world):
    from relax_straggler.live.aggregation import SideGroupGather

    side = SideGroupGather([0], metrics_rank=0)
    asked = SideFailure(0, GATHER_FAILED, 2, "Connection reset by peer")
    pending = side.gather(np.full(ROW_LEN, 5.0), step=5, request=asked)
    assert pending.wait()[0, 0] == 5.0 and pending.op_rows().shape == (1, 0)
    side.poll()
    assert side.requested.same(asked) and side.requested.detail == ""  # the text stays on the asking rank
    side.close()


@REAL_RUNS
def test_two_ranks_joining_each_gather_a_poll_period_apart_lose_no_gather(tmp_path):
    out = tmp_path / "race.json"
    torchrun(2, REPO / "tests" / "python" / "workers" / "side_race.py", [str(out), "300"])
    result = json.loads(out.read_text())
    assert (result["unavailable"], result["failed"]) == (0, None), result
