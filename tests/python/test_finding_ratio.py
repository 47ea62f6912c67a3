"""One finding, one ratio: the engine computes a finding's ratio once (the median, over its
recent reports that agree with its state, of its time over its group's reference;
docs/METRICS.md, "Ratios and excesses") and every output reads that number: the console
line, the JSONL row, straggler/verdict/ratio, the store's verdict rows, the run summary and
its headline, and `analyze`'s confirmed verdict in its text and JSON."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest

from relax_straggler.cli import main
from relax_straggler.judge.confirm import ConfirmedVerdict
from relax_straggler.judge.report import Report
from relax_straggler.reporters import ConsoleSink, JsonlSink, RunSummary
from relax_straggler.reporters.store_sink import StoreSink
from relax_straggler.stores import verdict_rows
from relax_straggler.stores.opener import open_store

STAGES = ("forward", "backward", "communication")
RANKS, SLOW = 8, 3
# Rank 3's forward over its peers', report by report from report 10: uneven on purpose, so
# that the latest report, the median over every tracked report and the median over the
# agreeing ones differ. Report 14 is healthy, the rank a little faster than its peers: it does
# not agree, not even as the weak evidence a sequential confirmation counts.
FACTORS = {10: 1.5, 11: 3.0, 12: 1.6, 13: 2.2, 14: 0.97, 15: 1.7, 16: 2.6, 17: 1.55, 18: 1.9, 19: 1.65}


def times(rng: np.random.Generator, step: int) -> np.ndarray:
    """One report, ms: 1 % jitter on compute; each rank waits at the all-reduce for the last."""
    t = np.empty((RANKS, 3))
    t[:, 0] = 40.0 * np.exp(rng.normal(0, 0.01, RANKS))
    t[:, 1] = 80.0 * np.exp(rng.normal(0, 0.01, RANKS))
    t[SLOW, 0] *= FACTORS.get(step, 1.0)
    arrive = t[:, 0] + t[:, 1]
    t[:, 2] = 20.0 * np.exp(rng.normal(0, 0.05, RANKS)) + arrive.max() - arrive
    return t


def run(steps: range, seed: int = 7) -> list[Report]:
    """The reports of a run through the live verdict, in step order."""
    rng = np.random.default_rng(seed)
    verdict = ConfirmedVerdict()
    out = []
    for step in steps:
        ms = times(rng, step)
        ref = np.median(ms, axis=0)
        metrics = {f"straggler/{s}/{k}": float(v) for j, s in enumerate(STAGES)
                   for k, v in (("ref_ms", ref[j]), ("mean_ms", ms[:, j].mean()), ("max_ms", ms[:, j].max()))}
        result = verdict.update(step, ms, STAGES)
        metrics.update(result.metrics())
        out.append(Report(step=step, stages=STAGES, device_ms=ms, judged_ms=ms, tokens=None, stragglers={},
                          likely_bottleneck=None, top_ranks={}, hints="", metrics=metrics, verdict=result))
    return out


def slow_finding(report: Report):
    (f,) = [f for f in report.verdict.findings if f.rank == SLOW and f.stage == "forward"]
    return f


def test_the_ratio_is_the_median_over_the_agreeing_reports_not_the_latest_one():
    reports = run(range(20))
    last = slow_finding(reports[-1])
    assert last.state == "straggler"
    # Each report's own t / ref is a fact of the finding in that report.
    own = {r.step: slow_finding(r).facts.rank_ms / slow_finding(r).facts.ref_ms for r in reports if r.step >= 12
           and any(f.rank == SLOW for f in r.verdict.findings)}
    agreeing = [own[s] for s in range(12, 20) if s != 14]  # the last 8 reports, but the healthy one
    assert last.facts.reports_seen == 8 and last.facts.reports_agreeing == 7
    assert last.ratio == pytest.approx(float(np.median(agreeing)), rel=1e-12)
    # ... which is neither the latest report's nor the median over every tracked report.
    assert abs(last.ratio - own[19]) > 0.05 and abs(last.ratio - last.facts.median_ratio) > 0.01


def test_one_finding_shows_one_ratio_in_every_output(tmp_path, capsys):
    reports = run(range(20))
    console, summary = io.StringIO(), RunSummary()
    sink, jsonl = ConsoleSink(console), JsonlSink(str(tmp_path / "straggler.jsonl"))
    store = StoreSink(f"file://{tmp_path}/store?job=j", flush_interval_s=0.05)
    for r in reports:
        for out in (sink, jsonl, store, summary):
            out.write(r)
    jsonl.close()
    assert store.flush(timeout_s=30)
    store.close()
    rows = [json.loads(line) for line in (tmp_path / "straggler.jsonl").read_text().splitlines()]

    # The console announces the confirmation once; its ratio is that report's JSONL row's.
    (line,) = [x for x in console.getvalue().splitlines() if f"rank {SLOW} straggler" in x]
    step = int(re.match(r"\[straggler\] step (\d+):", line).group(1))
    row = next(r for r in rows if r["step"] == step)
    (first,) = [f for f in row["verdict"]["findings"] if f["rank"] == SLOW and f["stage"] == "forward"]
    assert f"{first['ratio']:.2f}x its group" in line
    assert row["metrics"]["straggler/verdict/ratio"] == first["ratio"]

    # The run's end: the last report's finding, in the JSONL, the store, the summary and analyze.
    final = slow_finding(reports[-1]).ratio
    (last,) = [f for f in rows[-1]["verdict"]["findings"] if f["rank"] == SLOW and f["stage"] == "forward"]
    assert last["ratio"] == final and rows[-1]["metrics"]["straggler/verdict/ratio"] == final
    kept = open_store(f"file://{tmp_path}/store")
    try:
        assert verdict_rows.latest_verdict(kept.samples("j", 0, 100))["ratio"] == pytest.approx(final, rel=1e-12)
    finally:
        kept.close()
    (confirmed,) = summary.confirmed()
    assert confirmed.ratio == final
    assert f"{final:.2f}x its group" in summary.headline()

    assert main(["analyze", str(tmp_path / "straggler.jsonl"), "--format", "json"]) == 0
    offline = json.loads(capsys.readouterr().out)
    (named,) = [c for c in offline["confirmed"]["stragglers"] if c["stage"] == "forward"]
    assert (named["rank"], named["ratio"]) == (SLOW, pytest.approx(final, rel=1e-12))
    assert main(["analyze", str(tmp_path / "straggler.jsonl"), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert f"{final:.2f}x its group" in text.split("confirmed verdict")[1]


def test_a_late_arrival_flag_reads_above_one():
    # The per-step rule flags the rank that arrives last by its SHORT communication time: its
    # flag ratio is the reference over its time, not 0.10.
    ms = np.array([[40.0, 80.0, 25.0], [40.0, 80.0, 25.0], [90.0, 80.0, 2.5]])
    metrics = {f"straggler/{s}/ref_ms": v for s, v in zip(STAGES, (40.0, 80.0, 25.0))}
    summary = RunSummary()
    summary.write(Report(step=10, stages=STAGES, device_ms=ms, judged_ms=ms, tokens=None,
                   stragglers={"forward": (2,), "communication": (2,)}, likely_bottleneck=None, top_ranks={},
                   hints="", metrics=metrics, verdict=None))
    flags = {f.stage: f for f in summary.flags()}
    assert flags["forward"].median_flag_ratio == pytest.approx(2.25)
    assert flags["communication"].median_flag_ratio == pytest.approx(10.0)
    assert all(f.median_flag_ratio >= 1.0 for f in flags.values())
    assert "arrived last" in str(flags["communication"])
