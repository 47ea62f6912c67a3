"""A skipped row does not abort the what-if replay: the step it leaves incomplete is left
out, reported with the skipped row itself (file, line or row, why), and the other steps
are replayed; op-jsonl lines are numbered from 1 and its bad lines are skips like the
readers' rows (fatal with --strict)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from relax_straggler.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from fuzz_inputs import synthetic_rows  # noqa: E402  (dp 2 x pp 2, 3 steps, worker dp 1 / pp 1 slow)

def write_parquet(rows: list[dict], path: Path) -> Path:
    cols = {"dp_rank": "dp_rank", "stage": "stage", "rank": "rank", "step": "step", "optype": "optype",
            "start_ts": "start_s", "duration": "duration_s", "seq_id": "seq_id"}
    pq.write_table(pa.table({c: [r[k] for r in rows] for c, k in cols.items()}), path)
    return path


def write_op_jsonl(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _whatif(path: Path, capsys, *extra) -> tuple[int, dict, str]:
    code = main(["whatif", str(path), "--format", "json", "--no-by-worker", *extra])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out.strip() else {}), out.err


def test_the_synthetic_job_replays(tmp_path, capsys):
    code, out, err = _whatif(write_parquet(synthetic_rows(), tmp_path / "trace-syn.parquet"), capsys)
    assert code == 0, err
    assert out["slowdown"] > 1.05 and sorted(out["step_s"]) == ["0", "1", "2"]
    assert out["input"]["problems"]["total"] == 0


@pytest.mark.parametrize("writer, name", [(write_parquet, "trace-bad.parquet"), (write_op_jsonl, "ops.jsonl")])
@pytest.mark.parametrize("field, value", [("duration_s", -1.0), ("start_s", 1e300), ("duration_s", 1e300)])
def test_a_skipped_row_leaves_out_its_step_and_the_replay_goes_on(tmp_path, capsys, writer, name, field, value):
    # A time of 1e300 s is no time a clock wrote: the replay would print a 300-digit error.
    rows = synthetic_rows()
    bad = next(i for i, r in enumerate(rows) if r["step"] == 1)
    rows[bad][field] = value
    path = writer(rows, tmp_path / name)
    code, out, err = _whatif(path, capsys)
    assert code == 0, err
    assert sorted(out["step_s"]) == ["0", "2"]
    first = out["input"]["problems"]["first"]
    assert first[0].startswith(f"{path}:{bad + 1}: ") and field.split("_")[0] in first[0]
    assert any("step 1" in p and "left out of the what-if replay" in p for p in first), first
    assert out["steps_left_out"] == [1]
    assert f"{path}:{bad + 1}: " in err
    code, _, err = _whatif(path, capsys, "--strict")
    assert code == 1 and f"{path}:{bad + 1}: " in err


def test_op_jsonl_lines_are_numbered_from_one_and_values_are_checked(tmp_path, capsys):
    rows = synthetic_rows()
    lines = [json.dumps(r) for r in rows]
    lines[0] = json.dumps({**rows[0], "dp_rank": 1.5})
    lines[1] = json.dumps({**rows[1], "duration_s": "12.5"})
    lines[2] = "[" * 100_000
    lines[3] = json.dumps({**rows[3], "step": 2**63})
    path = tmp_path / "ops.jsonl"
    path.write_text("\n".join(lines) + "\n")
    code, out, err = _whatif(path, capsys)
    assert code == 0, err
    first = out["input"]["problems"]["first"]
    assert [p.split(": ", 1)[0] for p in first[:4]] == [f"{path}:{n}" for n in (1, 2, 3, 4)]
    assert "dp_rank" in first[0] and "duration_s" in first[1] and "nested" in first[2] and "step" in first[3]
    assert out["steps_left_out"] == [0]


def test_no_complete_step_refuses_naming_the_first_problem(tmp_path, capsys):
    # Each step loses its optimizer op on one dp_rank: as many short (step, dp_rank) groups as full ones.
    rows = [r for r in synthetic_rows() if not (r["optype"] == "optimizer" and r["dp_rank"] == r["step"] % 2)]
    path = write_op_jsonl(rows, tmp_path / "ops.jsonl")
    code, _, err = _whatif(path, capsys)
    assert code == 1 and f"{path}: " in err and "no step" in err


def test_a_bad_row_in_a_one_step_trace_refuses_rather_than_drop_its_dp_rank(tmp_path, capsys):
    # Leaving dp_rank 0 out would replay a job of one replica: a confident answer for another job.
    rows = synthetic_rows(steps=1)
    bad = next(i for i, r in enumerate(rows) if r["dp_rank"] == 0 and r["optype"] == "forward-compute")
    rows[bad]["duration_s"] = -1.0
    path = write_parquet(rows, tmp_path / "trace-one.parquet")
    code, out, err = _whatif(path, capsys)
    assert code == 1 and out == {}, out
    assert "dp_rank 0 runs the ops of the other dp_ranks in no step" in err
    assert "1 dp_ranks, not the recorded 2" in err and f"{path}:{bad + 1}: duration" in err


@pytest.mark.parametrize("sizes", [{"dp_size": 1, "pp_size": 2, "tp_size": 1},  # half the dp_ranks
                                   {"dp_size": 2, "pp_size": 1, "tp_size": 1}])  # half the stages
def test_a_meta_file_that_contradicts_the_trace_is_refused(tmp_path, capsys, sizes):
    path = write_parquet(synthetic_rows(), tmp_path / "trace-syn.parquet")
    (tmp_path / "meta-syn.yaml").write_text("".join(f"{k}: {v}\n" for k, v in sizes.items()))
    code, out, err = _whatif(path, capsys)
    assert code == 1 and out == {}, out
    assert "inconclusive" in err and "records were skipped" in err and "outside the declared layout" in err
    # analyze: no verdict either (dp 1 leaves a single rank, an error; pp 1 an inconclusive summary).
    assert main(["analyze", str(path), "--format", "json", "--no-progress"]) == 1
    out = capsys.readouterr().out
    if sizes["pp_size"] == 1:
        summary = json.loads(out)
        assert summary["verdict"]["reason"] == "rejected_input" and "inconclusive" in summary["whatif"]["error"]
