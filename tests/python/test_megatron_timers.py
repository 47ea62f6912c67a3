"""One Megatron timer vocabulary (relax_straggler/common/megatron_timers.py): every timer name
Megatron-Core / Megatron-LM start maps as documented, and the live adapter, the offline
readers, the store rows reader, the feed and the live sink all read it the same way."""

from __future__ import annotations

import math

import numpy as np
import pytest

from relax_straggler.common import megatron_timers as mt
from relax_straggler.common.stages import STAGE_IDS, STAGES
from relax_straggler.common.topology import Topology
from relax_straggler.integrations import megatron as live
from relax_straggler.monitor import feed
from relax_straggler.readers import megatron_names, metrics_rows, open_source
from relax_straggler.readers.base import P2P_OPS, Problems, StepTimes
from relax_straggler.reporters import store_sink
from relax_straggler.stores.base import Sample

RECV, SEND, AR = "communication/recv", "communication/send", "communication/allreduce"

# (timer name, stage, p2p column, part of): the documented decision for every name Megatron
# starts (megatron/core: schedules.py, p2p_communication.py, finalize_model_grads.py,
# optimizer/; megatron/training/training.py; pretrain_*.py), older ones still in recorded runs
# (grads-all-reduce, grads-reduce-scatter, layernorm-grads-all-reduce) and the what-if traces' gc.
DOCUMENTED = [
    ("forward-compute", "forward", None, None),
    ("backward-compute", "backward", None, None),
    ("batch-generator", "data", None, None),
    ("optimizer", "optimizer", None, None),
    ("optimizer-copy-to-main-grad", "optimizer", None, "optimizer"),
    ("optimizer-unscale-and-check-inf", "optimizer", None, "optimizer"),
    ("optimizer-clip-main-grad", "optimizer", None, "optimizer"),
    ("optimizer-count-zeros", "optimizer", None, "optimizer"),
    ("optimizer-inner-step", "optimizer", None, "optimizer"),
    ("optimizer-copy-main-to-model-params", "optimizer", None, "optimizer"),
    ("all-grads-sync", "communication", None, None),
    ("grads-reduce-scatter", "communication/reduce_scatter", None, None),
    ("params-all-gather", "communication/allgather", None, None),
    ("grads-all-reduce", AR, None, None),
    ("embedding-grads-all-reduce", AR, None, None),
    ("layernorm-grads-all-reduce", AR, None, None),
    ("non-tensor-parallel-grads-all-reduce", AR, None, None),
    ("conditional-embedder-grads-all-reduce", AR, None, None),
    ("forward-send", SEND, "forward-send", None),
    ("backward-send", SEND, "backward-send", None),
    ("forward-recv", RECV, "forward-recv", None),
    ("backward-recv", RECV, "backward-recv", None),
    ("forward-send-forward-recv", RECV, "forward-recv", None),
    ("forward-send-backward-recv", RECV, "backward-recv", None),
    ("backward-send-forward-recv", RECV, "forward-recv", None),
    ("backward-send-backward-recv", RECV, "backward-recv", None),
    ("forward-backward-send-forward-backward-recv", RECV, None, None),
    ("forward-backward", None, None, None),
    ("interval-time", None, None, None),
    ("evaluate", None, None, None),
    ("eval-time", None, None, None),
    ("save-checkpoint", None, None, None),
    ("save-checkpoint-non-persistent", None, None, None),
    ("load-checkpoint", None, None, None),
    ("model-and-optimizer-setup", None, None, None),
    ("train/valid/test-data-iterators-setup", None, None, None),
    ("gpu-sniff-test", None, None, None),
    ("gc", None, None, None),
]
# Names outside the table that a family or our own prefix decides.
FAMILIES = [
    ("optimizer-some-future-sub-step", "optimizer", None, "optimizer"),
    ("expert-grads-all-reduce", AR, None, None),
    ("rl/collect-rollouts", None, None, None),
    ("straggler/attention", "attention", None, None),
    ("straggler/communication/alltoall", "communication/alltoall", None, None),
]
EVERY = DOCUMENTED + FAMILIES


@pytest.mark.parametrize("name, stage, p2p, part_of", EVERY)
def test_each_timer_name_means_what_the_module_documents(name, stage, p2p, part_of):
    assert mt.timer_meaning(name) == mt.TimerMeaning(stage, p2p, part_of)


def test_the_table_is_exactly_the_documented_names_and_unknown_names_stay_unknown():
    assert set(mt.KNOWN_TIMERS) == {name for name, *_ in DOCUMENTED}
    for name in ("warp-drive", "forward-pp-comm", "straggler/no-such-stage", "Forward-Compute"):
        assert mt.timer_meaning(name) is None


class _Recorder:
    """A stage timer for MegatronTimers that records the stages opened."""

    sampled = True

    def __init__(self) -> None:
        self.opened: list[str] = []

    def start(self, sid: int) -> None:
        self.opened.append(STAGES[sid])

    def stop(self, sid: int) -> None:
        pass


def _rows(name: str, ms: float) -> list[Sample]:
    return [Sample(timestamp=0.0, job="j", metric_name=name, rank=0, iteration=1, values=(ms,)),
            Sample(timestamp=0.0, job="j", metric_name="straggler/moe", rank=0, iteration=1, values=(1.0,))]


@pytest.mark.parametrize("name, stage, p2p, part_of", EVERY)
def test_live_adapter_offline_readers_and_store_rows_agree(name, stage, p2p, part_of):
    # Live: a section of a stage timer opens its stage, part-of timers included.
    recorder = _Recorder()
    live.MegatronTimers(recorder)(name).start()
    assert recorder.opened == ([stage] if stage is not None else [])
    # Offline: recorded times are summed, so only a stage timer that is part of no other counts.
    counted = stage is not None and part_of is None
    target = megatron_names.timer_target(name)
    assert (target.stage, target.p2p) == ((STAGE_IDS[stage], None if p2p is None else P2P_OPS.index(p2p))
                                          if counted else (None, None))
    # Store rows go through the same targets.
    converter = metrics_rows.RowConverter("j", Problems("rows"))
    (step,) = converter.steps(_rows(name, 7.0))
    assert step.ms[0, STAGE_IDS["moe"]] == 1.0  # the other row, so that every iteration has a stage
    if counted:
        assert step.ms[0, STAGE_IDS[stage]] == 7.0
    assert (name in converter.excluded) == (not counted and name != "interval-time")
    assert not converter.unknown


def test_writers_use_the_stage_to_timer_direction_and_it_round_trips():
    assert feed.stage_timer_name is mt.stage_timer_name and store_sink.stage_timer_name is mt.stage_timer_name
    assert live.live_stage is mt.live_stage and megatron_names.timer_meaning is mt.timer_meaning
    assert metrics_rows.timer_target is megatron_names.timer_target
    for stage in STAGES:
        name = mt.stage_timer_name(stage)
        assert megatron_names.timer_target(name).stage == STAGE_IDS[stage], stage
        assert mt.live_stage(name) == stage
    assert mt.stage_timer_name("forward") == "forward-compute" and mt.stage_timer_name("moe") == "straggler/moe"
    with pytest.raises(ValueError, match="unknown stage"):
        mt.stage_timer_name("fwd")


def test_fed_rows_of_every_stage_read_back_onto_their_stage():
    ms = np.arange(1.0, 1.0 + 2 * len(STAGES)).reshape(2, len(STAGES))
    step = StepTimes(step=3, ranks=np.array([0, 1]), ms=ms, p2p_ms=None, step_ms=math.nan)
    table = feed.step_table("j", step, timestamp=0.0, ranks_per_node=1)
    rows = [Sample(timestamp=0.0, job="j", metric_name=r["metric_name"], rank=r["rank"], iteration=r["iteration"],
                   values=tuple(r["metric_values"])) for r in table.to_pylist()]
    (back,) = metrics_rows.RowConverter("j", Problems("rows")).steps(rows)
    np.testing.assert_array_equal(back.ms, ms)


def test_the_interleaved_two_way_exchange_counts_as_a_receive_wait_offline_too(tmp_path):
    """forward-backward-send-forward-backward-recv: the live adapter always timed it as
    communication/recv; offline it used to be excluded. Now a Megatron log adds it to recv
    (beside backward-recv), in no p2p column."""
    log = tmp_path / "train.log"
    blocks = {"forward-compute": (100.0, 100.0), "backward-recv": (4.0, 5.0),
              "forward-backward-send-forward-backward-recv": (30.0, 2.0)}
    lines = [" [2024-05-01 10:00:10] iteration       10/      60 | elapsed time per iteration (ms): 200.0 |",
             "times across ranks (ms):"]
    for name, per_rank in blocks.items():
        lines.append(f"  {name}:")
        lines += [f"     rank  {r}: {v:.2f}" for r, v in enumerate(per_rank)]
    log.write_text("\n".join(lines) + "\n")
    (step,) = list(open_source(str(log), "megatron-log", topology=Topology(dp=2, pp=1, tp=1)).steps())
    np.testing.assert_allclose(step.ms[:, STAGE_IDS[RECV]], [34.0, 7.0])
    np.testing.assert_allclose(step.p2p_ms[:, P2P_OPS.index("backward-recv")], [4.0, 5.0])
    assert np.isnan(step.p2p_ms[:, P2P_OPS.index("forward-recv")]).all()
