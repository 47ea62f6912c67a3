"""`relax-straggler whatif` on a parquet trace imports only what its path needs: no other
reader, no other subcommand, no pyarrow.compute, numpy.ma or rich (a clean run prints no
problem). Start-up imports are most of the command's time (docs/PERFORMANCE.md, "What-if")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from relax_straggler.readers import READERS, reader_class

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "whatif-traces"

_PROBE = """
import io, json, sys
from relax_straggler.cli import main
out, sys.stdout = sys.stdout, io.StringIO()
code = main(["whatif", sys.argv[1], "--format", "json"])
slowdown = json.loads(sys.stdout.getvalue())["slowdown"]
sys.stdout = out
print(json.dumps({"code": code, "slowdown": slowdown, "modules": sorted(sys.modules)}))
"""

UNNEEDED = ("relax_straggler.readers.chrome_trace", "relax_straggler.readers.megatron_log",
            "relax_straggler.readers.straggler_jsonl", "relax_straggler.cli.analyze", "relax_straggler.cli.monitor",
            "relax_straggler.analysis", "pyarrow.compute", "numpy.ma", "rich", "pandas", "torch")


def test_readers_table_names_each_class_by_its_format() -> None:
    for fmt in READERS:
        assert reader_class(fmt).format == fmt


def test_whatif_on_a_parquet_trace_imports_only_its_path() -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE, str(DATA / "trace-ST.parquet")], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["code"] == 0 and result["slowdown"] > 1.1  # the analysis ran
    loaded = set(result["modules"])
    assert "relax_straggler.readers.parquet_trace" in loaded
    assert [m for m in UNNEEDED if m in loaded] == []
