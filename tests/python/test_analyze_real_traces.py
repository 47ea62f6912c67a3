"""Acceptance on real Megatron traces with published answers (OSDI'25 what-if artifact,
tests/data/whatif-traces/README.md):

- AR (dp 4, pp 4, tp 4): one individual straggler, the worker dp_rank 0 / stage 0 (its four
  TP ranks), slow in forward and backward compute; nothing else.
- ST (dp 2, pp 4): stage 3 structurally slow (stage partitioning imbalance); no individual.

Both the per-op parquet trace and the Chrome timeline of each are analyzed; the answers
come from the analysis, the assertions only compare.
"""

from __future__ import annotations

import os

import pytest

from relax_straggler.analysis import AnalyzeConfig, analyze, build_summary
from relax_straggler.readers import open_source

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACES = os.path.join(REPO, "tests", "data", "whatif-traces")


def trace(name: str) -> str:
    path = os.path.join(TRACES, name)
    if not os.path.exists(path):
        pytest.fail(f"missing real trace {path}: the what-if traces ship in tests/data/whatif-traces")
    return path


@pytest.fixture(scope="module", params=["trace-AR.parquet", "timeline-AR.json.gz"])
def ar(request):
    return build_summary(analyze(open_source(trace(request.param)), AnalyzeConfig()))


@pytest.fixture(scope="module", params=["trace-ST.parquet", "timeline-ST.json.gz"])
def st(request):
    return build_summary(analyze(open_source(trace(request.param)), AnalyzeConfig()))


def test_ar_names_the_slow_worker_and_nothing_else(ar):
    assert ar["input"]["topology"]["world_size"] == 64
    assert ar["input"]["problems"]["total"] == 0
    assert ar["verdict"]["status"] == "stragglers"
    assert len(ar["anomalies"]) == 1, ar["anomalies"]
    a = ar["anomalies"][0]
    assert a["kind"] == "individual"
    assert (a["dp_rank"], a["pp_rank"]) == (0, 0)
    assert a["ranks"] == [0, 1, 2, 3]  # the worker's tensor-parallel ranks
    assert a["recorded_ranks"] == [0]  # the trace records TP rank 0 of each worker
    assert sorted(a["stages"]) == ["backward", "forward"]
    assert a["steps_flagged"] == a["steps_total"] == 44
    assert a["mean_ratio"] > 2.0  # the paper: ~708 ms vs ~300 ms


def test_ar_pipeline_waits_trace_back_to_the_slow_worker(ar):
    a = ar["anomalies"][0]
    if ar["input"]["format"] == "parquet-trace":  # the raw durations include the waits
        assert any("trace back to this worker" in e for e in a["evidence"])
        assert any(e.startswith("arrives last at communication/reduce_scatter") for e in a["evidence"])
    slowest = min(ar["per_rank"], key=lambda r: r["score"])
    assert slowest["rank"] == 0 and slowest["score"] < 0.5


def test_st_reports_stage_3_as_structural_only(st):
    assert st["input"]["topology"]["world_size"] == 8
    assert st["verdict"]["status"] == "imbalance"
    assert st["anomalies"], st["verdict"]
    assert {a["kind"] for a in st["anomalies"]} == {"structural"}
    assert len(st["anomalies"]) == 1
    a = st["anomalies"][0]
    assert a["pp_rank"] == 3 and a["dp_rank"] is None
    assert a["ranks"] == [6, 7]
    assert {"forward", "backward"} <= set(a["stages"])
    assert all(t["kind"] != "individual" for t in st["transient"])


def test_ensemble_votes_are_added_without_changing_the_anomalies():
    plain = build_summary(analyze(open_source(trace("trace-AR.parquet")), AnalyzeConfig()))
    both = build_summary(analyze(open_source(trace("trace-AR.parquet")), AnalyzeConfig(ensemble_steps=32)))
    assert plain["ensemble"] is None
    ens = both["ensemble"]
    assert ens["steps"] == 32 and "error" not in ens, ens
    assert set(ens["votes"]) <= {str(r["rank"]) for r in both["per_rank"]}
    strip = lambda s: [{k: v for k, v in a.items() if k != "evidence"} for a in s["anomalies"]]  # noqa: E731
    assert strip(both) == strip(plain)
    assert any(line.startswith("ensemble window detector") for line in both["anomalies"][0]["evidence"])


def test_the_ensemble_names_the_slow_pipeline_stage_by_its_pp_rank():
    ens = build_summary(analyze(open_source(trace("trace-ST.parquet")), AnalyzeConfig(ensemble_steps=32)))["ensemble"]
    forward = [i for i in ens["imbalance"] if i["stage"] == "forward"]
    assert len(forward) == 1 and forward[0]["slowest_pp_rank"] == 3 and forward[0]["ratio"] > 1, ens["imbalance"]
    assert not ens["anomalies"]
