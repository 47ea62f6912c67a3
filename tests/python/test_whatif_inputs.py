"""`whatif` reads its input as `analyze` does (format detection, --input-format, --strict,
skipped records named by file and row); `analyze` adds the what-if figures to its summary
for per-op inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from relax_straggler.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "whatif-traces"


def _st_with_a_duplicate(tmp_path: Path) -> tuple[Path, int]:
    """ST with its row 5 repeated at the end: (path, the 1-based row of the duplicate)."""
    table = pq.read_table(DATA / "trace-ST.parquet")
    path = tmp_path / "trace-dup.parquet"
    pq.write_table(pa.concat_tables([table, table.slice(4, 1)]), path)
    shutil.copy(DATA / "meta-ST.yaml", tmp_path / "meta-dup.yaml")
    return path, table.num_rows + 1


def test_whatif_reports_skipped_rows_and_strict_stops(tmp_path, capsys):
    path, row = _st_with_a_duplicate(tmp_path)
    assert main(["whatif", str(path), "--format", "json", "--no-by-worker"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["input"]["problems"]["by_kind"] == {"duplicate": 1}
    assert out["input"]["problems"]["first"][0].startswith(f"{path}:{row}: duplicate row")
    assert f"{path}:{row}: duplicate row" in captured.err
    ref = json.loads((DATA / "result-ST.json").read_text())["blocking_slowdown"]
    assert out["slowdown"] == pytest.approx(ref, rel=0.01)  # the duplicate was skipped, not replayed twice
    assert main(["whatif", str(path), "--strict"]) == 1
    assert f"{path}:{row}: duplicate row" in capsys.readouterr().err


def test_whatif_input_format_and_inputs_without_ops(tmp_path, capsys):
    renamed = tmp_path / "ops.dat"
    shutil.copy(DATA / "trace-ST.parquet", renamed)
    assert main(["whatif", str(renamed), "--input-format", "parquet-trace", "--no-by-worker"]) == 0
    assert capsys.readouterr().out.startswith("the job runs 1.18x slower")
    log = Path(__file__).parent / "fixtures" / "megatron_all.log"
    assert main(["whatif", str(log)]) == 1
    assert "has no per-op records" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["trace-AR.parquet", "timeline-AR.json.gz"])
def test_analyze_summary_carries_the_whatif_figures(name, capsys):
    ref = json.loads((DATA / "result-AR.json").read_text())
    assert main(["analyze", str(DATA / name), "--no-progress", "--format", "json"]) == 0
    w = json.loads(capsys.readouterr().out)["whatif"]
    assert w["slowdown"] == pytest.approx(ref["blocking_slowdown"], rel=0.01)
    assert (w["top_worker"]["dp_rank"], w["top_worker"]["stage"]) == (0, 0)
    mw = json.loads((DATA / "mw-AR.json").read_text())["Mw"]
    assert w["give_back"] == pytest.approx(mw, abs=0.02)
    assert main(["analyze", str(DATA / name), "--no-progress"]) == 0
    assert "what-if: the job runs 1.97x slower" in capsys.readouterr().out.replace("\n", " ")


def test_analyze_without_per_op_records_has_no_whatif(capsys):
    log = Path(__file__).parent / "fixtures" / "megatron_all.log"
    assert main(["analyze", str(log), "--no-progress", "--format", "json"]) == 0
    assert "whatif" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("sizes", ["dp_size: 1\npp_size: 4\ntp_size: 2\n",  # ST is dp 2 x pp 4 x tp 1
                                   "dp_size: 2\npp_size: 2\ntp_size: 2\n"])
def test_whatif_refuses_a_meta_file_that_contradicts_the_trace(tmp_path, capsys, sizes):
    # Half of ST's rows fall outside either layout; the rest replayed to S 1.18 with "126 % given
    # back" under the first, to S 1.49 (ST's is 1.18) under the second.
    path = tmp_path / "trace-ST.parquet"
    shutil.copy(DATA / "trace-ST.parquet", path)
    (tmp_path / "meta-ST.yaml").write_text(sizes)
    assert main(["whatif", str(path), "--format", "json", "--no-by-worker"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "inconclusive" in captured.err and "records were skipped" in captured.err
    assert "outside the declared layout" in captured.err
