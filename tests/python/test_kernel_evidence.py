"""Kernel records as evidence (--straggler-kernel-stats), in one process: synthetic activity
records through the engine's KernelStats binding, the row's kernel fields, the report's
metrics, the confirmed verdict's cause, and the analyzer end to end (losses untouched)."""

import logging
import math
import time

import numpy as np
import pytest
import torch

from relax_straggler import StragglerConfig
from relax_straggler._ext import core, ext
from relax_straggler.common.payload import KERNEL_FIELDS, ROW_LEN, KernelMatrix, pack, unpack
from relax_straggler.common.stages import STAGES, stage_id
from relax_straggler.judge.confirm import CAUSES, ConfirmedVerdict
from relax_straggler.judge.report import build_report
from relax_straggler.live.kernel_evidence import CuptiKernelSource, SyntheticKernelSource, open_kernel_source
import relax_straggler

MS = 1_000_000  # ns
FORWARD, BACKWARD = stage_id("forward"), stage_id("backward")
NCCL = "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LLP24ncclDevKernelArgsStorageILm4096EE"
GEMM = "_Z9gemm_bf16PfS_i"


def one_step(step):
    """Forward: a 10 ms section on stream 7 with gemm 1-5 ms and 4-6 ms (overlapping: 5 ms
    busy), an NCCL kernel 7-8 ms, a memcpy 8-9 ms; backward: two 4 ms microbatch sections
    with a 3 ms kernel each. A kernel on another stream and one outside every section."""
    t0 = 1_000 * MS
    records = [("kernel", t0 + 1 * MS, t0 + 5 * MS, 7, GEMM), ("kernel", t0 + 4 * MS, t0 + 6 * MS, 7, GEMM),
               ("kernel", t0 + 7 * MS, t0 + 8 * MS, 7, NCCL), ("memcpy", t0 + 8 * MS, t0 + 9 * MS, 7, None),
               ("kernel", t0 + 1 * MS, t0 + 9 * MS, 3, "other_stream"),
               ("kernel", t0 + 11 * MS, t0 + 14 * MS, 7, "bwd"), ("kernel", t0 + 16 * MS, t0 + 19 * MS, 7, "bwd"),
               ("kernel", t0 + 50 * MS, t0 + 51 * MS, 7, "outside")]
    sections = [("forward", 7, t0, t0 + 10 * MS), ("backward", 7, t0 + 10 * MS, t0 + 14 * MS),
                ("backward", 7, t0 + 15 * MS, t0 + 19 * MS)]
    return records, sections


def test_synthetic_records_give_each_stage_its_kernel_idle_and_nccl_time():
    source = SyntheticKernelSource(one_step)
    source.begin_step(0)
    k = source.end_step(0)
    assert k.kernel_ms[FORWARD] == pytest.approx(5.0)  # the union: overlapping gemms count once
    assert k.nccl_ms[FORWARD] == pytest.approx(1.0)
    assert k.idle_ms[FORWARD] == pytest.approx(3.0)  # 10 - 5 - 1 - 1 (copy)
    assert k.kernel_ms[BACKWARD] == pytest.approx(6.0)  # two sections summed
    assert k.idle_ms[BACKWARD] == pytest.approx(2.0)
    assert k.nccl_ms[BACKWARD] == pytest.approx(0.0)
    others = [i for i in range(len(STAGES)) if i not in (FORWARD, BACKWARD)]
    assert np.isnan(k.kernel_ms[others]).all()  # no section: not measured
    assert k.top["forward"][0] == ("gemm_bf16", pytest.approx(6.0), 2)  # summed durations, clipped
    assert k.top["forward"][1][0] == "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    assert k.records == 8 and k.unattributed_records == 2  # the other stream's and the late one
    assert k.fields().shape == (len(STAGES), len(KERNEL_FIELDS))


def test_the_next_step_starts_empty_and_bad_input_is_named():
    source = SyntheticKernelSource(one_step)
    for step in range(2):
        source.begin_step(step)
        assert source.end_step(step).records == 8
    with pytest.raises(ValueError, match="stage"):
        SyntheticKernelSource(lambda s: ([], [("fwd", 0, 0, 10)])).end_step(0)
    with pytest.raises(ValueError, match="activity kind"):
        SyntheticKernelSource(lambda s: ([("kernal", 1, 2, 0, None)], [])).end_step(0)
    assert SyntheticKernelSource(lambda s: None).end_step(0) is None


def test_rows_carry_the_kernel_fields_and_keep_one_layout():
    kernel = np.full((len(STAGES), len(KERNEL_FIELDS)), np.nan)
    kernel[FORWARD] = (8.0, 1.5, 0.5)
    device = np.full(len(STAGES), np.nan)
    device[FORWARD] = 10.0
    zeros, ones = np.zeros(len(STAGES)), np.ones(len(STAGES))
    with_kernel = pack(3, np.nan, 0, device, device, zeros, ones, [1.0, 2.0], kernel=kernel)
    without = pack(3, np.nan, 1, device, device, zeros, ones, [1.0, 2.0])
    assert with_kernel.shape == without.shape == (ROW_LEN,)
    g = unpack(np.stack([with_kernel, without]))
    assert g.kernel.kernel_ms[0, FORWARD] == 8.0 and g.kernel.idle_ms[0, FORWARD] == 1.5
    assert g.kernel.nccl_ms[0, FORWARD] == 0.5
    assert np.isnan(g.kernel.kernel_ms[1]).all()  # not measured
    assert g.comparable_count.tolist() == [2, 2] and g.comparable_ms[0, :2].tolist() == [1.0, 2.0]
    assert np.isnan(g.comparable_ms[:, 2:]).all()  # the kernel block is not read as collectives
    with pytest.raises(ValueError, match="kernel must have shape"):
        pack(3, np.nan, 0, device, device, zeros, ones, kernel=np.zeros(3))


def rows(forward_ms, kernel_fields, step=5):
    """One step's gathered rows: forward as given, backward 50 ms; kernel_fields per rank:
    (kernel_ms, idle_ms, nccl_ms) of forward, or None (not measured)."""
    out = []
    for rank, (ms, fields) in enumerate(zip(forward_ms, kernel_fields)):
        device = np.full(len(STAGES), np.nan)
        device[FORWARD], device[BACKWARD] = ms, 50.0
        kernel = None
        if fields is not None:
            kernel = np.full((len(STAGES), len(KERNEL_FIELDS)), np.nan)
            kernel[FORWARD] = fields
        out.append(pack(step, np.nan, rank, device, device, np.zeros(len(STAGES)), np.ones(len(STAGES)),
                        kernel=kernel))
    return unpack(np.stack(out))


KERNELS = StragglerConfig(enabled=True, kernel_stats=True)


def test_the_report_publishes_the_top_ranks_kernel_and_idle_time():
    g = rows([10.0, 10.0, 30.0], [(8.0, 1.5, 0.5), (8.0, 1.5, 0.5), (8.0, 21.5, 0.5)])
    m = build_report(g, 5, KERNELS, 0, {}).metrics
    assert m["straggler/forward/top_rank"] == 2
    assert m["straggler/forward/kernel_ms"] == 8.0
    assert m["straggler/forward/idle_ms"] == 21.5
    assert m["straggler/forward/nccl_ms"] == 0.5
    assert math.isnan(m["straggler/backward/kernel_ms"])  # not measured there


def test_without_the_flag_the_report_has_no_kernel_metrics():
    g = rows([10.0, 10.0, 30.0], [(8.0, 1.5, 0.5)] * 3)
    report = build_report(g, 5, StragglerConfig(enabled=True), 0, {})
    assert not [k for k in report.metrics if k.endswith(("/kernel_ms", "/idle_ms", "/nccl_ms"))]
    assert report.kernel is None


def test_a_mismatched_ranks_kernel_fields_are_not_judged():
    g = rows([10.0, 10.0, 30.0], [(8.0, 1.5, 0.5)] * 3)
    g.steps[2] = 4  # a rank whose step counter differs
    report = build_report(g, 5, KERNELS, 0, {})
    assert np.isnan(report.kernel.kernel_ms[2]).all()
    assert report.kernel.kernel_ms[0, report.stages.index("forward")] == 8.0


def confirm(slow_fields, reports=8, peer_fields=(8.0, 1.5, 0.5)):
    """The confirmed verdict over `reports` reports of 3 ranks, rank 2 slow in forward
    (30 ms against 10) from the third report on, its forward kernel fields as given."""
    v = ConfirmedVerdict()
    rng = np.random.default_rng(7)
    result = None
    for step in range(reports):
        ms = np.array([[10.0, 50.0]] * 3) * (1 + 0.01 * rng.standard_normal((3, 2)))
        fields = np.array([peer_fields] * 3, dtype=np.float64)
        if step >= 2:
            ms[2, 0] = 30.0
            fields[2] = slow_fields
        nan = np.full(3, np.nan)
        kernel = KernelMatrix(np.stack([fields[:, 0], nan], 1), np.stack([fields[:, 1], nan], 1),
                              np.stack([fields[:, 2], nan], 1))
        result = v.update(step, ms, ("forward", "backward"), kernel=kernel)
    return result


@pytest.mark.parametrize("fields, cause", [
    ((28.0, 1.5, 0.5), "device"),  # the kernels ran 20 ms longer
    ((8.0, 21.5, 0.5), "host"),  # the stream sat idle 20 ms longer
    ((8.0, 1.5, 20.5), "communication_link"),  # NCCL 20 ms longer, the peers' compute normal
    ((np.nan, np.nan, np.nan), "compute"),  # not measured: the stage times' cause
    ((18.0, 11.5, 0.5), "compute"),  # split evenly: the records do not tell
])
def test_the_confirmed_cause_follows_the_kernel_records(fields, cause):
    r = confirm(fields)
    assert r.status == "straggler" and r.primary.rank == 2 and r.primary.stage == "forward"
    assert r.primary.cause == cause and cause in CAUSES
    assert r.metrics()["straggler/verdict/cause"] == cause
    k = r.primary.facts.kernel  # the measured times, apart from the cause
    assert k.ref_kernel_ms == 8.0 and k.ref_idle_ms == 1.5 and k.peers == 2
    assert k.kernel_ms == fields[0] or (math.isnan(k.kernel_ms) and math.isnan(fields[0]))


def test_without_kernel_records_the_verdict_is_unchanged():
    v = ConfirmedVerdict()
    rng = np.random.default_rng(7)
    for step in range(8):
        ms = np.array([[10.0, 50.0]] * 3) * (1 + 0.01 * rng.standard_normal((3, 2)))
        if step >= 2:
            ms[2, 0] = 30.0
        r = v.update(step, ms, ("forward", "backward"))
    assert r.primary.cause == "compute" and r.primary.facts.kernel is None
    with pytest.raises(ValueError, match="kernel.kernel_ms has shape"):
        v.update(9, ms, ("forward", "backward"), kernel=KernelMatrix(np.zeros((2, 2)), np.zeros((3, 2)),
                                                                     np.zeros((3, 2))))


def test_the_engine_rule_is_bound():
    K = core().kernels
    group = [K.KernelTimes(8.0, 1.5, 0.5), K.KernelTimes(8.0, 1.5, 0.5), K.KernelTimes(8.0, 1.5, 7.0)]
    r = K.kernel_cause(group, 2)
    assert r.cause == "communication_link" and r.nccl_excess_ms == pytest.approx(6.5)
    assert K.kernel_cause(group, 2, K.KernelCauseConfig(min_excess_ms=7.0)).cause == "unknown"
    with pytest.raises(ValueError, match="min_share"):
        K.KernelCauseConfig(min_share=0.4)
    with pytest.raises(ValueError, match="rank 3"):
        K.kernel_cause(group, 3)


# The analyzer end to end, one process -------------------------------------------------

def forward_plan(step):
    """A 10 ms forward section with 8 ms of kernels."""
    t0 = (step + 1) * 100 * MS
    return [("kernel", t0 + MS, t0 + 9 * MS, 0, GEMM)], [("forward", 0, t0, t0 + 10 * MS)]


def train(config, source=None, steps=6):
    """Losses of a tiny seeded model trained `steps` steps under the analyzer, and its reports."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reports = []
    analyzer = relax_straggler.install(model, opt, config=config, report_fn=lambda m, s, details: reports.append({**m, **details}),
                                       kernel_source=source)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    losses = []
    try:
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
    finally:
        analyzer.uninstall()
    return torch.stack(losses), reports


SAMPLED = dict(enabled=True, interval=1, warmup_steps=0, hang_seconds=0.0, window_every=0)


def test_the_analyzer_publishes_kernel_metrics_and_leaves_the_losses_bitwise_equal():
    plain, _ = train(StragglerConfig(**SAMPLED))
    with_kernels, reports = train(StragglerConfig(**SAMPLED, kernel_stats=True), SyntheticKernelSource(forward_plan))
    assert torch.equal(plain, with_kernels)
    assert len(reports) == 6
    assert all(m["straggler/forward/kernel_ms"] == pytest.approx(8.0) for m in reports)
    assert all(m["straggler/forward/idle_ms"] == pytest.approx(2.0) for m in reports)


class Counting:
    """A synthetic source that counts its calls."""

    name = "counting"

    def __init__(self, fail=False):
        self.begun, self.ended, self.closed, self.fail = [], [], 0, fail

    def begin_step(self, step):
        self.begun.append(step)

    def end_step(self, step):
        self.ended.append(step)
        if self.fail:
            raise RuntimeError("source broke")
        return SyntheticKernelSource(forward_plan).end_step(step)

    def close(self):
        self.closed += 1


def test_the_source_is_asked_on_sampled_steps_only():
    source = Counting()
    train(StragglerConfig(enabled=True, interval=2, warmup_steps=1, hang_seconds=0.0, window_every=0,
                          kernel_stats=True), source, steps=7)
    assert source.begun == source.ended == [2, 4, 6]
    assert source.closed == 1


def test_a_failing_source_warns_once_and_training_continues(caplog):
    source = Counting(fail=True)
    with caplog.at_level(logging.WARNING, logger="relax_straggler.live.analyzer"):
        losses, reports = train(StragglerConfig(**SAMPLED, kernel_stats=True), source)
    assert len(losses) == 6 and len(reports) == 6
    assert source.ended == [0]  # dropped after its failure
    assert sum("kernel-record source counting failed" in r.getMessage() for r in caplog.records) == 1
    assert all(math.isnan(m["straggler/forward/kernel_ms"]) for m in reports)


@pytest.mark.skipif(core().kernels.WITH_CUPTI, reason="this build has CUPTI")
def test_the_flag_on_a_build_without_cupti_warns_once_and_runs_on_events(caplog):
    with caplog.at_level(logging.WARNING, logger="relax_straggler.live.kernel_evidence"):
        losses, reports = train(StragglerConfig(**SAMPLED, kernel_stats=True))
        assert open_kernel_source() is None
    warnings = [r.getMessage() for r in caplog.records if "--straggler-kernel-stats" in r.getMessage()]
    assert len(warnings) <= 1  # once per process: an earlier test may have had it
    assert len(reports) == 6
    assert all(math.isnan(m["straggler/forward/kernel_ms"]) for m in reports)
    assert all(not math.isnan(m["straggler/forward/local_ms"]) for m in reports)


class StandInCollector:
    """CuptiCollector's interface over the engine's SectionRecorder and KernelStats, on any
    build: the test issues the correlation ids and adds the records CUPTI would deliver."""

    mode = "kernels"

    def __init__(self, begin_ok=True):
        self.recorder = core().kernels.SectionRecorder()
        self.stats = core().kernels.KernelStats(64)
        self.begin_ok = begin_ok
        self.shutdowns = 0

    def section_observer(self):
        return self.recorder.observer()

    def begin_sampled_step(self, profiler_active):
        self.recorder.clear()
        self.stats.clear()
        return self.begin_ok

    def end_observed_step(self, timed, top_k):
        return self.stats.summarize_ids(self.recorder.sections(timed), top_k)

    def shutdown(self):
        self.shutdowns += 1


def test_the_cupti_source_attributes_records_by_id_to_the_timers_sections():
    timer = ext().StageTimer(len(STAGES), 1)
    collector = StandInCollector()
    source = CuptiKernelSource(timer, collector)
    assert timer.has_section_observer
    assert timer.begin_step(0)
    source.begin_step(0)
    with timer.section(FORWARD):
        collector.stats.add("kernel", 10 * MS, 14 * MS, 0, GEMM, collector.recorder.issue())
        collector.stats.add("kernel", 14 * MS, 15 * MS, 0, NCCL, collector.recorder.issue())
        time.sleep(0.010)
    collector.stats.add("kernel", 15 * MS, 16 * MS, 0, GEMM, collector.recorder.issue())  # after the section
    timer.end_step()
    k = source.end_step(0)
    (stage, device_ms), = timer.last_sections
    assert stage == FORWARD and device_ms >= 10.0 * 0.95
    assert k.kernel_ms[FORWARD] == pytest.approx(4.0)
    assert k.nccl_ms[FORWARD] == pytest.approx(1.0)
    assert k.idle_ms[FORWARD] == pytest.approx(device_ms - 5.0)  # the events' time less the kernels'
    assert np.isnan(k.kernel_ms[BACKWARD])
    assert k.unattributed_records == 1
    source.close()
    source.close()
    assert not timer.has_section_observer
    assert collector.shutdowns == 1


def test_a_step_the_collector_declines_is_not_measured():
    timer = ext().StageTimer(len(STAGES), 1)
    source = CuptiKernelSource(timer, StandInCollector(begin_ok=False))
    timer.begin_step(0)
    source.begin_step(0)
    with timer.section(FORWARD):
        pass
    timer.end_step()
    assert source.end_step(0) is None
    source.close()


@pytest.mark.skipif(core().kernels.WITH_CUPTI, reason="this build has CUPTI")
def test_without_cupti_there_is_no_cupti_source_even_over_a_timer():
    timer = ext().StageTimer(len(STAGES), 1)
    assert open_kernel_source(timer) is None
    with pytest.raises(RuntimeError, match="without CUPTI"):
        CuptiKernelSource(timer)
    assert not timer.has_section_observer


@pytest.mark.skipif(not core().kernels.WITH_CUPTI, reason="this build has no CUPTI")
def test_with_cupti_a_cpu_timer_gets_no_source_and_a_cuda_one_does(caplog):
    assert open_kernel_source(ext().StageTimer(len(STAGES), 1)) is None  # CPU timing: no kernels
    if torch.cuda.is_available():
        timer = ext().StageTimer(len(STAGES), 1, use_cuda=True)
        source = open_kernel_source(timer)
        assert isinstance(source, CuptiKernelSource) and timer.has_section_observer
        source.close()


def test_a_source_without_the_flag_is_refused():
    with pytest.raises(ValueError, match="kernel_stats"):
        relax_straggler.install(None, config=StragglerConfig(enabled=True), kernel_source=Counting())


def test_the_flag_is_off_by_default_and_parsed():
    import argparse

    parser = argparse.ArgumentParser()
    relax_straggler.add_arguments(parser)
    assert relax_straggler.from_args(parser.parse_args([])).kernel_stats is False
    assert relax_straggler.from_args(parser.parse_args(["--straggler-kernel-stats"])).kernel_stats is True
