"""The detection-quality scenarios (benchmarks/detection_quality.py), short configuration:
one seed, 160 sampled steps of 128 ranks. Targets: no false alarm on a
healthy run, F1 >= 0.99 for single-rank slowdowns of 10 % and more, a structurally slow
pipeline stage reported as stage imbalance and not as stragglers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import detection_quality as dq  # noqa: E402

STEPS = 160
SEED = 7


def scenario(prefix: str) -> dq.Scenario:
    (sc,) = [s for s in dq.scenarios() if s.name.startswith(prefix)]
    return sc


def score(sc: dq.Scenario, detector: str) -> dict[str, str]:
    s = dq.Score()
    s.add(sc, dq.detectors()[detector](dq.generate(sc, STEPS, SEED)), STEPS)
    return s.row()


@pytest.mark.parametrize("detector", ["ensemble (window, 6 clusterers)", "confirmed verdict"])
def test_healthy_run_raises_no_alarm(detector):
    assert score(scenario("healthy"), detector)["false alarms / 1k steps"] == "0.0"


@pytest.mark.parametrize("pct", [10, 20, 50, 100])
def test_single_slow_rank_f1(pct):
    row = score(scenario(f"slow rank {pct} %"), "confirmed verdict")
    assert float(row["F1"]) >= 0.99, row
    assert row["false alarms / 1k steps"] == "0.0"


def test_slow_node_is_found_whole():
    row = score(scenario("slow node"), "confirmed verdict")
    assert float(row["recall"]) == 1.0 and float(row["precision"]) == 1.0, row


def test_slow_link_is_a_link_not_a_straggler():
    sc = scenario("slow link")
    ms = dq.generate(sc, STEPS, SEED)
    ensemble = dq.detectors()["ensemble (window, 6 clusterers)"](ms)
    assert all(not flagged for _, flagged in ensemble)  # no compute straggler anywhere
    row = score(sc, "confirmed verdict")  # confirmed as a communication link
    assert float(row["F1"]) >= 0.99, row


def test_slow_pipeline_stage_is_imbalance_not_stragglers():
    sc = scenario("slow pipeline stage")
    ms = dq.generate(sc, STEPS, SEED)
    answers = dq.detectors()["confirmed verdict"](ms)
    assert all(not flagged for _, flagged in answers)
    det = dq.WindowDetector(window=dq.WINDOW, every=dq.EVERY, skip_reports=dq.WARMUP,
                            rank_to_group=[r // dq.PER_GROUP for r in range(dq.RANKS)])
    for s in range(STEPS):
        det.observe(dq._Report(s, dq.STAGES, ms[s]))
    imbalance = {i.stage: i for i in det.last_result.imbalance}
    assert set(imbalance) >= {"forward", "backward"}
    assert imbalance["backward"].slowest_group == 3
    assert imbalance["backward"].ratio == pytest.approx(1.25, abs=0.03)
