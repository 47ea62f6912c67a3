"""The Megatron-Core Timers adapter: stage mapping, chaining, no synchronize or barrier,
the train_step() scope, and (with the real megatron-core package driving
get_forward_backward_func() on CPU) the same verdicts as direct hooks on one 2-rank run."""

import json
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from relax_straggler import StragglerConfig
from relax_straggler._ext import ext
from relax_straggler.common.stages import STAGES, stage_id
from relax_straggler.integrations.megatron import MegatronTimers, NullMegatronAnalysis, StepLabels, install

from conftest import DETECTION, REAL_RUNS, REPO, read_jsonl, torchrun
from workers.step_times import assert_not_blocked

pytestmark = [REAL_RUNS, DETECTION]

C = ext()


class Log:
    """A shared call log for a fake stage timer and a fake chained Timers object."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []


class FakeStageTimer:
    sampled = True

    def __init__(self, log: Log) -> None:
        self.log = log

    def start(self, sid: int) -> None:
        self.log.calls.append(("ours.start", STAGES[sid]))

    def stop(self, sid: int) -> None:
        self.log.calls.append(("ours.stop", STAGES[sid]))


class FakeTimers:
    """Megatron's Timers interface, recording calls."""

    def __init__(self, log: Log) -> None:
        self.record = log
        self.made: dict[str, SimpleNamespace] = {}

    def __call__(self, name, log_level=None):
        log = self.record

        def start(barrier=False):
            log.calls.append(("inner.start", name, barrier))

        def stop(barrier=False):
            log.calls.append(("inner.stop", name, barrier))

        timer = self.made.setdefault(name, SimpleNamespace(start=start, stop=stop, elapsed=lambda **k: 1.5,
                                                           log_level=log_level))
        return timer

    def log(self, names, rank=None, normalizer=1.0, reset=True, barrier=False):
        self.record.calls.append(("inner.log", tuple(names), normalizer))

    def write(self, names, writer, iteration, normalizer=1.0, reset=True, barrier=False):
        self.record.calls.append(("inner.write", tuple(names), iteration))

    def get_all_timers_string(self, names=None):
        return "timers"


def test_megatron_names_open_their_stage_and_custom_tables_are_checked():
    log = Log()
    timers = MegatronTimers(FakeStageTimer(log))
    for name in ("forward-compute", "backward-compute", "forward-recv", "backward-send", "forward-send-backward-recv",
                 "all-grads-sync", "params-all-gather", "embedding-grads-all-reduce", "optimizer-inner-step"):
        timers(name).start()
    assert [stage for _, stage in log.calls] == ["forward", "backward", "communication/recv", "communication/send",
                                                 "communication/recv", "communication", "communication/allgather",
                                                 "communication/allreduce", "optimizer"]
    with pytest.raises(ValueError, match="unknown stage"):
        MegatronTimers(FakeStageTimer(Log()), stages={"forward-compute": "fwd"})


def test_chained_timer_starts_first_and_stops_last_and_only_it_sees_the_barrier():
    log = Log()
    timers = MegatronTimers(FakeStageTimer(log), inner=FakeTimers(log))
    t = timers("forward-compute", log_level=2)
    assert timers("forward-compute") is t  # one view per name
    t.start(barrier=True)
    t.stop(barrier=True)
    assert log.calls == [("inner.start", "forward-compute", True), ("ours.start", "forward"),
                         ("ours.stop", "forward"), ("inner.stop", "forward-compute", True)]
    assert t.elapsed(reset=False) == 1.5 and t.log_level == 2  # the rest is the chained timer's


def test_unmapped_names_and_timers_methods_go_to_the_chained_object():
    log = Log()
    inner = FakeTimers(log)
    timers = MegatronTimers(FakeStageTimer(log), inner=inner)
    assert timers("interval-time", log_level=0) is inner.made["interval-time"]
    timers.log(["forward-compute"], normalizer=10)
    timers.write(["forward-compute"], None, 7)
    assert timers.get_all_timers_string() == "timers"
    assert timers.inner is inner
    assert log.calls == [("inner.log", ("forward-compute",), 10), ("inner.write", ("forward-compute",), 7)]


def test_without_a_chained_object_unmapped_names_and_logging_do_nothing():
    log = Log()
    timers = MegatronTimers(FakeStageTimer(log))
    t = timers("interval-time", log_level=0)
    t.start(barrier=True)
    t.stop()
    assert t.elapsed() == 0.0 and timers.log(["x"]) is None and timers.write(["x"], None, 1) is None
    timers("backward-compute").start()
    timers("backward-compute").stop()
    assert log.calls == [("ours.start", "backward"), ("ours.stop", "backward")]
    with pytest.raises(AttributeError, match="chains to no Timers"):
        timers.get_all_timers_string()


def test_sections_accumulate_per_stage_and_nothing_synchronizes(monkeypatch):
    def forbidden(*a, **k):
        raise AssertionError("the adapter synchronized or joined a barrier")

    monkeypatch.setattr(torch.cuda, "synchronize", forbidden)
    monkeypatch.setattr(dist, "barrier", forbidden)
    timer = C.StageTimer(len(STAGES), interval=1)
    timers = MegatronTimers(timer)
    timer.begin_step(0)
    for _ in range(3):  # microbatches
        timers("forward-compute", log_level=2).start()
        time.sleep(0.002)
        timers("forward-compute").stop()
        timers("forward-send-backward-recv", log_level=2).start()
        timers("forward-send-backward-recv").stop()
        timers("backward-compute", log_level=2).start(barrier=True)
        timers("backward-compute").stop(barrier=True)
    timers("all-grads-sync", log_level=1).start(barrier=True)
    timers("all-grads-sync").stop(barrier=True)
    s = timer.end_step()
    calls = dict(zip(STAGES, s.calls))
    assert calls["forward"] == 3 and calls["backward"] == 3 and calls["communication/recv"] == 3
    assert calls["communication"] == 1 and calls["optimizer"] == 0
    assert s.device_ms[stage_id("forward")] >= 6.0 * 0.95
    assert timer.unmatched_stops == 0 and timer.open_at_step_end == 0


def test_step_labels_are_bounded_and_fall_back_to_the_analyzer_step():
    labels = StepLabels(capacity=2)
    for s in range(4):
        labels.put(s, 100 + s)
    assert labels.pop(3) == 103 and labels.pop(3) == 3  # popped once
    assert labels.pop(0) == 0  # evicted: the oldest go first


def test_disabled_install_touches_nothing():
    cfg = SimpleNamespace(timers="theirs")
    analysis = install(torch.nn.Linear(2, 2), None, config=StragglerConfig(enabled=False), model_config=cfg)
    assert isinstance(analysis, NullMegatronAnalysis) and not analysis.enabled
    with analysis.train_step(step=3):
        assert cfg.timers == "theirs"
    assert analysis.train_step() is analysis.section("forward")


def test_train_step_swaps_adapters_in_and_out_and_labels_reports():
    model_cfg = SimpleNamespace(timers=None)
    opt_cfg = SimpleNamespace(timers=FakeTimers(Log()))
    optimizer = SimpleNamespace(config=opt_cfg, chained_optimizers=[SimpleNamespace(config=opt_cfg)])
    reports = []
    analysis = install(torch.nn.Linear(2, 2), optimizer, model_config=model_cfg,
                       config=StragglerConfig(enabled=True, interval=2, warmup_steps=0),
                       report_fn=lambda m, s, details: reports.append((s, {**m, **details})))
    try:
        for it in range(4):
            with analysis.train_step(step=500 + it):
                assert isinstance(model_cfg.timers, MegatronTimers) and model_cfg.timers.inner is None
                assert isinstance(opt_cfg.timers, MegatronTimers) and opt_cfg.timers.inner is not None
                model_cfg.timers("forward-compute", log_level=2).start()
                model_cfg.timers("forward-compute").stop()
                opt_cfg.timers("optimizer-inner-step", log_level=1).start(barrier=False)
                opt_cfg.timers("optimizer-inner-step").stop()
                with pytest.raises(RuntimeError, match="already open"):
                    with analysis.train_step():
                        pass
            assert model_cfg.timers is None and isinstance(opt_cfg.timers, FakeTimers)
        with pytest.raises(KeyError):
            with analysis.train_step(step=600):
                raise KeyError("boom")
        assert model_cfg.timers is None  # restored on the exception too
    finally:
        analysis.uninstall()
    assert [s for s, _ in reports] == [500, 502]  # sampled steps 0 and 2, with the loop's numbers
    for _, m in reports:
        assert m["straggler/forward/local_ms"] >= 0 and m["straggler/optimizer/local_ms"] >= 0
        assert m["straggler/open_at_step_end"] == 0


def test_microbatch_workloads_add_up_inside_a_step_only(tmp_path):
    jsonl = tmp_path / "reports.jsonl"
    cfg = SimpleNamespace(timers=None)
    analysis = install(torch.nn.Linear(2, 2), None, model_config=cfg,
                       config=StragglerConfig(enabled=True, interval=1, warmup_steps=0, jsonl_path=str(jsonl)))
    try:
        analysis.add_workload(1000)  # outside a step (a log-prob forward): ignored
        with analysis.train_step():
            for tokens in (100, 250, 0):
                analysis.add_workload(tokens)
            cfg.timers("forward-compute").start()
            cfg.timers("forward-compute").stop()
        with analysis.train_step():  # no workload given: raw times
            cfg.timers("forward-compute").start()
            cfg.timers("forward-compute").stop()
        with pytest.raises(ValueError, match="finite number >= 0"):
            analysis.add_workload(float("nan"))
    finally:
        analysis.uninstall()
    assert [r["tokens"] for r in read_jsonl(jsonl)] == [[350.0], None]


def test_real_megatron_schedule_drives_the_stages_and_leaves_losses_alone(tmp_path):
    pytest.importorskip("megatron.core")
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from workers.megatron_worker import (MICROBATCHES, TinyModel, allreduce_grads_finalize, batches, forward_step,
                                         megatron_on_cpu)

    def train(analysis, model, fb) -> list[float]:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for step in range(3):
            with analysis.train_step():
                out = fb(forward_step_func=forward_step, data_iterator=batches(0, step), model=model,
                         num_microbatches=MICROBATCHES, seq_length=8, micro_batch_size=2, forward_only=False)
                opt.step()
                opt.zero_grad()
            losses += [d["loss"].item() for d in out]
        return losses

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1)
        megatron_on_cpu()
        fb = get_forward_backward_func()
        assert fb.__name__ == "forward_backward_no_pipelining"
        torch.manual_seed(0)
        model = TinyModel()
        model.config.finalize_model_grads_func = allreduce_grads_finalize
        plain = train(NullMegatronAnalysis(), model, fb)

        torch.manual_seed(0)
        model = TinyModel()
        model.config.finalize_model_grads_func = allreduce_grads_finalize
        reports = []
        analysis = install(model, None, config=StragglerConfig(enabled=True, interval=1, warmup_steps=0),
                           report_fn=lambda m, s, details: reports.append({**m, **details}))
        observed = train(analysis, model, fb)
        timer = analysis.analyzer.timer
        recorded = timer.events_recorded
        # Evaluation outside train_step() (a sampled step is open): config.timers is back to
        # None and nothing is recorded.
        fb(forward_step_func=forward_step, data_iterator=batches(0, 9), model=model, num_microbatches=1,
           seq_length=8, micro_batch_size=2, forward_only=True)
        assert model.config.timers is None and timer.sampled and timer.events_recorded == recorded
        analysis.uninstall()
        assert observed == plain  # bitwise
        assert len(reports) == 3
        for m in reports:
            for stage in ("forward", "backward", "communication"):
                assert m[f"straggler/{stage}/local_ms"] > 0, stage
        assert timer.unmatched_stops == 0 and timer.open_at_step_end == 0
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def test_same_verdicts_as_direct_hooks_and_pipeline_semantics_on_2_rank_megatron_runs(tmp_path):
    pytest.importorskip("megatron.core")
    out = tmp_path / "reports.json"
    torchrun(2, REPO / "tests" / "python" / "workers" / "megatron_worker.py", [str(out)], timeout_s=150)
    result = json.loads(out.read_text())
    assert_not_blocked(dict(enumerate(result["step_s"])), warmup=2, expected_steps=3 * 6)
    assert result["calls"] == [{"synchronize": 0, "barrier": 0}] * 2
    via_timers, via_hooks = result["timers"], result["hooks"]
    assert [s for s, _ in via_timers] == [102, 103, 104, 105]  # the loop's step numbers
    assert len(via_hooks) == len(via_timers)
    for (step, a), (_, b) in zip(via_timers, via_hooks):
        for m in (a, b):
            forward = {k: v for k, v in m.items() if k.startswith("straggler/forward/")}
            assert m["straggler/forward/top_rank"] == 1 and m["straggler/forward/num_stragglers"] == 1, \
                (step, "timers" if m is a else "hooks", m["straggler/hints"], forward)
            # Backward carries the host's jitter only, which the per-step rule may flag: on a
            # busy host a 1-ms backward can be 2x its peer's, so its excess in ms is compared.
            excess = {s: m[f"straggler/{s}/max_ms"] - m[f"straggler/{s}/ref_ms"] for s in ("forward", "backward")}
            assert excess["backward"] < excess["forward"], excess
        assert a["straggler/likely_bottleneck"] == "forward"
    # 1F1B over two pipeline stages, the last one 30 ms slower per microbatch. Judged
    # within pipeline stages (the default), one rank per stage has no peer: the difference
    # is structural imbalance, not a straggler.
    pipelined = result["pipeline"]
    assert [s for s, _ in pipelined] == [102, 103, 104, 105]
    for _, m in pipelined:
        assert m["straggler/num_stragglers"] == 0, m["straggler/hints"]
        assert m["straggler/forward/imbalance_ratio"] > 2.0
        assert "structural imbalance in forward" in m["straggler/hints"]
    # Compared across stages, the slow stage's forward is named, and the first stage's
    # waits on it are in the p2p stages, where the slow stage is the one that waits least.
    ungrouped = result["pipeline_ungrouped"]
    assert [s for s, _ in ungrouped] == [102, 103, 104, 105]
    for _, m in ungrouped:
        assert "straggler/forward/imbalance_ratio" not in m
        assert m["straggler/forward/top_rank"] == 1, m["straggler/hints"]
        assert m["straggler/forward/max_ms"] >= 3 * 30.0 * 0.95  # accumulated over the 3 microbatches
        for op in ("send", "recv"):
            assert m[f"straggler/communication/{op}/top_rank"] == 1
            # rank 0, the metrics rank, is the one that waits longest
            assert m[f"straggler/communication/{op}/local_ms"] == pytest.approx(m[f"straggler/communication/{op}/max_ms"])


def test_relax_attach_installs_once_per_process_and_logs_through_tracking_utils(monkeypatch):
    pytest.importorskip("megatron.core")
    import argparse
    import sys
    import types

    from relax_straggler.integrations import relax

    logged = []
    tracking = types.ModuleType("relax.utils.tracking_utils")
    tracking.log = lambda args, metrics, step_key: logged.append((dict(metrics), step_key))
    for name, module in (("relax", types.ModuleType("relax")), ("relax.utils", types.ModuleType("relax.utils")),
                         ("relax.utils.tracking_utils", tracking)):
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["relax"].utils = sys.modules["relax.utils"]
    sys.modules["relax.utils"].tracking_utils = tracking

    parser = relax.add_arguments(argparse.ArgumentParser())
    assert isinstance(parser, argparse.ArgumentParser)
    assert not relax.config_from_args(parser.parse_args([])).enabled
    assert not relax.config_from_args(argparse.Namespace()).enabled  # a Relax without the flags
    args = parser.parse_args(["--straggler-analysis", "--straggler-interval", "1", "--straggler-warmup-steps", "0"])

    chunk = torch.nn.Linear(2, 2)
    chunk.config = SimpleNamespace(timers=None)  # what get_model_config() finds on a Megatron chunk
    steps_per_rollout = 2
    try:
        for rollout_id in range(2):  # Relax calls train() once per rollout
            analysis = relax.attach(args, [chunk], None)
            assert analysis is relax.attach(args, [chunk], None)
            for step_id in range(steps_per_rollout):
                with analysis.train_step(step=rollout_id * steps_per_rollout + step_id):
                    relax.add_workload(64 + step_id)  # what the patched forward step reports
                    chunk.config.timers("forward-compute", log_level=2).start()
                    chunk(torch.randn(3, 2))
                    chunk.config.timers("forward-compute").stop()
        with pytest.raises(RuntimeError, match="other model chunks"):
            relax.attach(args, [torch.nn.Linear(2, 2)], None)
    finally:
        relax.detach()
    assert [m["train/step"] for m, _ in logged] == [0, 1, 2, 3]
    assert all(key == "train/step" and m["straggler/forward/local_ms"] > 0 for m, key in logged)


def test_pp2_dp2_a_slow_last_stage_rank_is_confirmed_and_the_waiting_stage_never_blamed(tmp_path):
    pytest.importorskip("megatron.core")
    out = tmp_path / "pp_dp.json"
    torchrun(4, REPO / "tests" / "python" / "workers" / "megatron_pp_dp.py", [str(out)], timeout_s=200)
    result = json.loads(out.read_text())
    assert_not_blocked(dict(enumerate(result["step_s"])), warmup=2, expected_steps=40)
    onset, slow = result["onset"], result["slow_rank"]
    # A rank the crowded host keeps waiting for a CPU is named for host_contention: not what
    # this run injects (tests/python/test_run_queue.py).
    named = [(s, -1, "") if m["straggler/verdict/cause"] == "host_contention"
             else (s, m["straggler/verdict/rank"], m["straggler/verdict/stage"]) for s, m in result["reports"]]
    # Nobody before the onset; rank 3 in forward within 5 reports after it, from then on.
    assert [n for n in named if n[0] < onset and n[1] != -1] == [], named
    after = [n for n in named if n[0] >= onset]
    first = next(i for i, n in enumerate(after) if n[1] == slow)
    assert first <= 4, named
    assert all(n[1:] == (slow, "forward") for n in after[first:]), named
    # Stage 0 (ranks 0, 1) waits on it in the pipeline recvs and rank 2 in the gradient
    # all-reduce: never named.
    assert not any(n[1] in (0, 1, 2) for n in named), named
