"""The steps the what-if replay models (relax_straggler.whatif.complete.complete_steps): a step
where some dp_rank misses an op or records one twice is left out and reported, the others
kept; the answer does not depend on how many records one pass takes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from relax_straggler.readers import OpRecords, Problems
from relax_straggler.whatif import complete
from relax_straggler.whatif.complete import complete_steps
from relax_straggler.whatif.errors import WhatIfInputError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from fuzz_inputs import SYNTHETIC_OPTYPES, synthetic_rows  # noqa: E402  (dp 2 x pp 2)


def as_records(rows: list[dict]) -> OpRecords:
    col = lambda k, t: np.array([r[k] for r in rows], dtype=t)  # noqa: E731
    names = list(SYNTHETIC_OPTYPES)
    return OpRecords(dp_rank=col("dp_rank", np.int32), stage=col("stage", np.int32), step=col("step", np.int64),
                     optype=np.array([names.index(r["optype"]) for r in rows], dtype=np.int32),
                     start=col("start_s", np.float64), duration=col("duration_s", np.float64),
                     seq_id=col("seq_id", np.int32), microbatch=np.full(len(rows), -1, np.int32),
                     chunk=np.zeros(len(rows), np.int32), optype_names=names, rank=col("rank", np.int64))


def damaged() -> list[dict]:
    """4 steps; step 1 misses an op of dp_rank 1, step 2 records one of dp_rank 0 twice."""
    rows = synthetic_rows(steps=4)
    missing = next(i for i, r in enumerate(rows) if r["step"] == 1 and r["dp_rank"] == 1)
    twice = next(r for r in rows if r["step"] == 2 and r["dp_rank"] == 0)
    return [r for i, r in enumerate(rows) if i != missing] + [dict(twice)]


@pytest.mark.parametrize("chunk", [1 << 22, 7, 1])
def test_incomplete_steps_are_left_out_and_said_why_whatever_the_pass_size(monkeypatch, chunk):
    monkeypatch.setattr(complete, "_CHUNK", chunk)
    rows = damaged()
    problems = Problems("trace.parquet")
    kept = complete_steps(as_records(rows), problems)
    assert kept.left_out_steps == [1, 2]
    assert sorted(set(kept.step.tolist())) == [0, 3]
    assert len(kept) == sum(r["step"] in (0, 3) for r in rows)
    said = [p.message for p in problems.kept]
    assert any("step 1 left out" in m and "dp_rank 1 records" in m and "ops, not the" in m for m in said), said
    assert any("step 2 left out" in m and "dp_rank 0 records an op twice" in m for m in said), said


def test_a_complete_trace_comes_back_as_it_is_and_a_dp_rank_complete_nowhere_refuses(monkeypatch):
    monkeypatch.setattr(complete, "_CHUNK", 5)
    rec = as_records(synthetic_rows())
    assert complete_steps(rec, Problems("t")) is rec
    rows = [r for r in synthetic_rows() if not (r["dp_rank"] == 1 and r["seq_id"] == 0 and r["stage"] == 0)]
    with pytest.raises(WhatIfInputError, match="dp_rank 1 runs the ops of the other dp_ranks in no step"):
        complete_steps(as_records(rows), Problems("t"))
