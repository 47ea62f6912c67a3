"""Comparison groups on the live path: ranks judged within their group (pipeline stage),
the spread between groups reported as structural imbalance (report.build_report over
packed payload rows, as the metrics rank sees them)."""

import logging

import numpy as np
import pytest
import torch

from relax_straggler import StragglerConfig
from relax_straggler.common.payload import pack, unpack
from relax_straggler.common.stages import STAGES, stage_id
from relax_straggler.judge import report as report_module
from relax_straggler.judge.report import build_report
import relax_straggler

FORWARD, BACKWARD = stage_id("forward"), stage_id("backward")


def gathered(forward_ms, groups, step=5):
    """One step's rows: forward as given, backward 50 ms everywhere, nothing else run."""
    rows = []
    for rank, (ms, group) in enumerate(zip(forward_ms, groups)):
        device = np.full(len(STAGES), np.nan)
        device[FORWARD], device[BACKWARD] = ms, 50.0
        rows.append(pack(step, np.nan, rank, device, device, np.zeros(len(STAGES)), np.ones(len(STAGES)), (), group))
    return unpack(np.stack(rows))


CONFIG = StragglerConfig(enabled=True)
PIPELINE = [0, 0, 1, 1, 2, 2, 3, 3]  # pp 4 x dp 2: the pipeline stage of each rank


def test_heavier_last_pipeline_stage_is_imbalance_not_a_straggler():
    report = build_report(gathered([100, 100, 100, 100, 100, 100, 150, 150], PIPELINE), 5, CONFIG, 0, {})
    m = report.metrics
    assert report.stragglers["forward"] == ()
    assert m["straggler/num_stragglers"] == 0
    assert m["straggler/forward/imbalance_ratio"] == pytest.approx(1.5)
    assert m["straggler/forward/mean_ms"] == pytest.approx(112.5)
    assert "structural imbalance in forward: 1.50x" in m["straggler/hints"]
    assert report.groups.tolist() == PIPELINE
    # The same step compared across pipeline stages: the last stage's ranks look slow.
    ungrouped = build_report(gathered([100, 100, 100, 100, 100, 100, 150, 150], [None] * 8), 5, CONFIG, 0, {})
    assert ungrouped.stragglers["forward"] == (6, 7)
    assert "straggler/forward/imbalance_ratio" not in ungrouped.metrics
    assert ungrouped.groups is None


def test_slow_rank_is_judged_against_its_own_pipeline_stage():
    # Rank 3 is 30 % slower than its dp peer (rank 2); rank 6's 150 ms is its stage's norm.
    report = build_report(gathered([100, 100, 100, 130, 100, 100, 150, 150], PIPELINE), 5, CONFIG, 0, {})
    m = report.metrics
    assert report.stragglers["forward"] == (3,)
    assert m["straggler/forward/top_rank"] == 3
    assert m["straggler/forward/ref_ms"] == pytest.approx(115.0)  # rank 3's group
    assert m["straggler/likely_bottleneck"] == "forward"
    assert m["straggler/hints"].startswith("rank 3 is slow in forward: 130.0 ms vs group mean 115.0 ms")


def test_groups_on_some_ranks_only_compare_all_ranks_and_warn_once(caplog, monkeypatch):
    monkeypatch.setattr(report_module, "_warned", set())
    groups = [0, 0, 1, None]
    with caplog.at_level(logging.WARNING, logger="relax_straggler.judge.report"):
        for step in (5, 6):
            report = build_report(gathered([100, 100, 100, 160], groups, step), step, CONFIG, 0, {})
            assert report.groups is None and report.stragglers["forward"] == (3,)
    assert sum("gave no comparison group" in r.message for r in caplog.records) == 1


def test_one_rank_per_group_says_nobody_can_be_named(caplog, monkeypatch):
    # PP = 4 alone: every rank is its own group, only the imbalance can be reported.
    monkeypatch.setattr(report_module, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="relax_straggler.judge.report"):
        for step in (5, 6):
            report = build_report(gathered([100, 100, 100, 150], [0, 1, 2, 3], step), step, CONFIG, 0, {})
            assert report.metrics["straggler/num_stragglers"] == 0
            assert report.metrics["straggler/forward/imbalance_ratio"] == pytest.approx(1.5)
    assert sum("every comparison group has one rank" in r.message for r in caplog.records) == 1


def test_one_group_everywhere_is_the_ungrouped_verdict():
    a = build_report(gathered([100, 100, 100, 160], [2, 2, 2, 2]), 5, CONFIG, 0, {})
    b = build_report(gathered([100, 100, 100, 160], [None] * 4), 5, CONFIG, 0, {})
    assert a.metrics == b.metrics and a.groups is None


@pytest.mark.parametrize("bad", [-1, 1.5, True, "0", 2**31])  # ids travel as int32 to the verdict
def test_install_rejects_a_bad_comparison_group(bad):
    with pytest.raises(ValueError, match="comparison_group"):
        relax_straggler.install(torch.nn.Linear(2, 2), None, comparison_group=bad)


def test_install_fails_fast_without_the_engine_extension(monkeypatch):
    # An old build (before relax_straggler._core existed) still has _C: install must say so
    # at once rather than log a failed report on every sampled step.
    from relax_straggler.live import analyzer as analyzer_module

    def missing():
        raise ImportError("relax_straggler._core is not built")

    monkeypatch.setattr(analyzer_module, "core", missing)
    with pytest.raises(ImportError, match="_core is not built"):
        relax_straggler.install(torch.nn.Linear(2, 2), None)
    assert not analyzer_module._ACTIVE


def test_a_section_that_was_all_wait_ran_and_computes_next_to_nothing():
    # Rank 0 is blocked inside its forward for the whole section on the slow rank 1 (e.g. a
    # token-count all-reduce inside Megatron's forward step): its compute is ~0, and rank 1
    # is the straggler against it, not the only rank that ran forward.
    rows = []
    for rank, (forward, waited) in enumerate(((40.0, 40.0), (120.0, 0.0))):
        device = np.full(len(STAGES), np.nan)
        device[FORWARD], device[BACKWARD] = forward, 50.0
        wait = np.zeros(len(STAGES))
        wait[FORWARD] = waited
        rows.append(pack(5, np.nan, rank, device, device, wait, np.ones(len(STAGES)), ()))
    r = build_report(unpack(np.stack(rows)), 5, CONFIG, 0, {})
    assert r.stragglers["forward"] == (1,), r.hints
    assert r.metrics["straggler/forward/local_ms"] == report_module.MIN_COMPUTE_MS
    assert r.metrics["straggler/unusable_times"] == 0
