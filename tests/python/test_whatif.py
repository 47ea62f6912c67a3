"""The what-if simulator on the study's real traces (ST: stage imbalance, AR: one slow
worker): S, every attribution entry, M_W and M_S against the published answers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from relax_straggler.cli import main as cli_main
from relax_straggler.whatif import run_whatif

DATA = Path(__file__).resolve().parents[1] / "data" / "whatif-traces"


def _published(name: str) -> tuple[dict, dict, dict]:
    load = lambda p: json.loads((DATA / f"{p}-{name}.json").read_text())  # noqa: E731
    return load("result"), load("mw"), load("ms")


@pytest.mark.parametrize(("name", "source"), [("ST", "trace-{}.parquet"), ("AR", "trace-{}.parquet"),
                                              ("ST", "timeline-{}.json.gz")])
def test_matches_published_answers(name: str, source: str) -> None:
    ref, mw, ms = _published(name)
    r = run_whatif(DATA / source.format(name))
    assert r.slowdown == pytest.approx(ref["blocking_slowdown"], rel=0.01)
    for ours, key in ((r.by_dp_rank, "dp_rank"), (r.by_stage, "stage"), (r.by_optype, "optype")):
        theirs = ref[f"blocking_decompose_by_{key}"]
        assert {str(k) for k in ours} == set(theirs)
        for k, v in theirs.items():
            assert ours[int(k) if key != "optype" else k] == pytest.approx(v, abs=0.02), (key, k)
    assert r.m_w.rem == pytest.approx(mw["Mw"], abs=0.02)
    assert r.m_s.rem == pytest.approx(ms["Ms"], abs=0.02)
    # Simulation error: replayed vs measured step time, within 2 % and close to the study's.
    assert abs(r.simulation_error - 1.0) < 0.02
    assert r.simulation_error == pytest.approx(ref["launch_slowdown"], abs=0.005)
    for step, s in ref["blocking_step_slowdown"].items():
        assert r.per_step[int(step)] == pytest.approx(s, rel=0.01)


def test_ar_names_the_slow_worker_and_is_fast() -> None:
    t0 = time.perf_counter()
    r = run_whatif(DATA / "trace-AR.parquet")
    elapsed = time.perf_counter() - t0
    assert r.top_workers == [(0, 0)]
    assert r.by_worker[(0, 0)] > 1.9
    others = [v for w, v in r.by_worker.items() if w != (0, 0)]
    assert max(others) < 1.05
    assert elapsed < 5.0  # the < 0.5 s target is measured in benchmarks/whatif_speed.py


def test_cli_json_and_outputs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    png, timeline = tmp_path / "h.png", tmp_path / "ideal.json"
    assert cli_main(["whatif", str(DATA / "trace-ST.parquet"), "--format", "json", "--heatmap", str(png),
                     "--ideal-timeline", str(timeline)]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("slowdown", "by_dp_rank", "by_stage", "by_optype", "by_worker", "per_step", "m_w", "m_s",
                "simulation_error"):
        assert key in out
    assert set(out["by_stage"]) == {"0", "1", "2", "3"} and "1/3" in out["by_worker"]
    assert png.read_bytes()[:4] == b"\x89PNG"
    events = [e for e in json.loads(timeline.read_text())["traceEvents"] if e["ph"] == "X"]
    # The ideal timeline of step 23 ends at the ideal step time.
    ideal_s = out["step_s"]["23"]["ideal"]
    ends = [e["ts"] + e["dur"] for e in events if e["args"]["step"] == 23]
    assert max(ends) * 1e-6 == pytest.approx(ideal_s, rel=1e-6)


def test_cli_text_summary(capsys: pytest.CaptureFixture) -> None:
    assert cli_main(["whatif", str(DATA / "trace-AR.parquet")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == ("the job runs 1.97x slower than without stragglers; fixing worker dp 0 / pp 0 would leave 1.00x, "
                     "giving back 100 % of the lost time")


def test_bad_input_names_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "ops.jsonl"
    bad.write_text('{"dp_rank": 0, "stage": 0, "step": 1, "optype": "forward-compute"}\n')
    assert cli_main(["whatif", str(bad)]) == 1
    assert "ops.jsonl:1" in capsys.readouterr().err
