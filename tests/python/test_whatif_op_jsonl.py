"""Our own per-op JSONL as what-if input: the ST trace's rows written as op-jsonl replay
to the same answers as the parquet trace itself."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from relax_straggler.cli import main as cli_main
from relax_straggler.whatif import run_whatif

DATA = Path(__file__).resolve().parents[1] / "data" / "whatif-traces"


def _write_op_jsonl(path: Path) -> int:
    rows = pq.read_table(DATA / "trace-ST.parquet").to_pylist()
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"dp_rank": r["dp_rank"], "stage": r["stage"], "step": r["step"],
                                "optype": r["optype"], "start_s": r["start_ts"], "duration_s": r["duration"],
                                "seq_id": r["seq_id"], "microbatch": r["mb_id"], "chunk": r["mc"],
                                "rank": r["rank"]}) + "\n")
    return len(rows)


def test_op_jsonl_replays_like_the_parquet_trace(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ops = tmp_path / "ops.jsonl"
    n = _write_op_jsonl(ops)
    ref = run_whatif(DATA / "trace-ST.parquet")
    assert cli_main(["whatif", str(ops), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["input"]["format"] == "op-jsonl" and out["input"]["ops"] == n
    assert out["slowdown"] == pytest.approx(ref.slowdown, rel=1e-9)
    assert out["by_stage"] == {str(k): pytest.approx(v, rel=1e-9) for k, v in ref.by_stage.items()}
    assert out["m_s"] == pytest.approx(ref.m_s.rem, rel=1e-9)


def test_a_damaged_first_line_still_reads_as_op_jsonl_and_is_reported(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    ops = tmp_path / "ops.jsonl"
    n = _write_op_jsonl(ops)
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text('{"dp_rank": 0, "stage": 0, "st\n' + ops.read_text())
    assert cli_main(["whatif", str(damaged), "--format", "json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["input"]["format"] == "op-jsonl" and out["input"]["ops"] == n
    assert "damaged.jsonl:1:" in captured.err
