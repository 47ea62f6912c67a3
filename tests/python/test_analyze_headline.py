"""`analyze`'s first line is derived from the findings it lists (analysis/headline.py): a
confirmed straggler or a what-if stage imbalance under a CLEAN headline was a contradiction."""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from relax_straggler._ext import core
from relax_straggler.analysis.headline import headline
from relax_straggler.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from fuzz_inputs import SYNTHETIC_OPTYPES  # noqa: E402

_COLUMNS = {"dp_rank": "dp_rank", "stage": "stage", "rank": "rank", "step": "step", "optype": "optype",
            "start_ts": "start_s", "duration": "duration_s", "seq_id": "seq_id"}


def se_like_trace(path: Path, dp: int = 2, pp: int = 2, steps: int = 6, factor: float = 1.5) -> Path:
    """An op trace like the study's SE job: the last pipeline stage computes `factor` x as long
    as the others in every step, on every dp rank (the engine's synthetic 1F1B job, its last
    stage's computes stretched, each worker's later ops pushed back so none overlaps)."""
    m = core().whatif.synthetic_model(dp, pp, 4, steps, seed=1)
    start, end = m.timeline(False)
    slots = len(m.slot_stage)
    start, end = start.reshape(steps, slots, dp), end.reshape(steps, slots, dp)
    ops = collections.defaultdict(list)
    for k, step in enumerate(m.steps):
        for slot in range(slots):
            for lane, d in enumerate(m.dp_ranks):
                stage, name = m.slot_stage[slot], SYNTHETIC_OPTYPES[m.slot_optype[slot]]
                ops[(d, stage, step)].append({"dp_rank": d, "stage": stage, "rank": d + dp * stage, "step": step,
                                              "optype": name, "start_s": 10.0 + start[k, slot, lane],
                                              "duration_s": end[k, slot, lane] - start[k, slot, lane],
                                              "seq_id": m.slot_seq[slot]})
    rows = []
    for worker in ops.values():
        worker.sort(key=lambda r: r["start_s"])
        free = -np.inf
        for r in worker:
            if r["stage"] == pp - 1 and r["optype"].endswith("-compute"):
                r["duration_s"] *= factor
            r["start_s"] = max(r["start_s"], free)
            free = r["start_s"] + r["duration_s"]
        rows += worker
    pq.write_table(pa.table({c: [r[k] for r in rows] for c, k in _COLUMNS.items()}), path)
    return path


def late_straggler_jsonl(path: Path, steps: int = 30, slow_from: int = 20) -> Path:
    """Our JSONL, 8 ranks: rank 3 1.6x slower in forward from `slow_from` on, fewer steps
    than the attribution's persistence asks, but enough for the confirmed verdict."""
    rng = np.random.default_rng(3)
    with open(path, "w") as f:
        for step in range(steps):
            ms = np.empty((8, 2))
            ms[:, 0] = 40.0 * np.exp(rng.normal(0, 0.01, 8))
            ms[:, 1] = 80.0 * np.exp(rng.normal(0, 0.01, 8))
            if step >= slow_from:
                ms[3, 0] *= 1.6
            f.write(json.dumps({"step": step, "stages": ["forward", "backward"], "device_ms": ms.tolist()}) + "\n")
    return path


def analyze_both(path: Path, capsys) -> tuple[dict, list[str]]:
    assert main(["analyze", str(path), "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert main(["analyze", str(path), "--no-progress"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.strip()]
    return summary, lines


def verdict_line(lines: list[str]) -> str:
    return next(x for x in lines if x.split(":")[0] in ("STRAGGLERS", "IMBALANCE", "CLEAN", "INCONCLUSIVE"))


def test_a_stage_imbalance_shown_by_the_whatif_is_no_clean_run(tmp_path, capsys):
    summary, lines = analyze_both(se_like_trace(tmp_path / "trace-SE.parquet"), capsys)
    whatif = summary["whatif"]
    assert whatif["slowdown"] > 1.05 and whatif["m_s"] > 0.5  # what the line under the headline shows
    assert summary["confirmed"]["final_status"] == "imbalance"
    assert summary["verdict"]["status"] == "imbalance"
    assert "fixing the last pipeline stage gives back" in summary["verdict"]["summary"]
    assert verdict_line(lines).startswith("IMBALANCE: ")


def test_a_confirmed_straggler_is_in_the_headline(tmp_path, capsys):
    summary, lines = analyze_both(late_straggler_jsonl(tmp_path / "straggler.jsonl"), capsys)
    assert summary["anomalies"] == []  # the attribution alone: too few steps to persist
    (c,) = summary["confirmed"]["stragglers"]
    assert (c["rank"], c["stage"]) == (3, "forward")
    assert summary["verdict"]["status"] == "stragglers"
    line = verdict_line(lines)
    assert line.startswith("STRAGGLERS: confirmed straggler rank 3 in forward")
    assert f"{c['ratio']:.2f}x its group" in summary["verdict"]["summary"]


def test_a_healthy_run_is_clean(tmp_path, capsys):
    summary, lines = analyze_both(late_straggler_jsonl(tmp_path / "straggler.jsonl", slow_from=10**6), capsys)
    assert summary["confirmed"]["stragglers"] == [] and summary["verdict"]["status"] == "clean"
    assert verdict_line(lines).startswith("CLEAN: ")


CLEAN = {"status": "clean", "summary": "no persistent straggler or imbalance in 40 steps"}
NOTHING = {"statuses": {"healthy": 40}, "final_status": "healthy", "stragglers": [], "imbalance": []}


@pytest.mark.parametrize("whatif, status", [
    ({"slowdown": 1.01, "m_s": 0.9, "give_back": 0.1, "top_worker": None}, "clean"),  # under the impact rule
    ({"slowdown": 1.3, "m_s": 0.9, "give_back": 0.1, "top_worker": None}, "imbalance"),
    ({"slowdown": 1.3, "m_s": 0.0, "give_back": 0.9, "top_worker": {"dp_rank": 1, "stage": 0}}, "stragglers"),
    ({"slowdown": 1.3, "m_s": 0.2, "give_back": 0.2, "top_worker": {"dp_rank": 1, "stage": 0}}, "clean"),
    ({"error": "cannot replay"}, "clean"),
])
def test_the_whatif_names_a_cause_only_beyond_the_impact_rule(whatif, status):
    assert headline(CLEAN, NOTHING, whatif, min_impact=0.02)["status"] == status


def test_an_inconclusive_input_stays_inconclusive_and_unjudged_ranks_are_not_clean():
    rejected = {"status": "inconclusive", "summary": "only 2 step(s)", "reason": "too_few_steps"}
    confirmed = {**NOTHING, "stragglers": [{"rank": 1, "stage": "forward", "since_step": 1, "steps": 1,
                                            "ratio": 2.0, "cause": "compute"}]}
    assert headline(rejected, confirmed, None, 0.02) == rejected
    alone = {**NOTHING, "final_status": "insufficient_evidence"}
    assert headline(CLEAN, alone, None, 0.02)["status"] == "inconclusive"
