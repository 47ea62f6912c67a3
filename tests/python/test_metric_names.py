"""One table of the names the package publishes (relax_straggler/common/metric_names.py): the docs
document exactly its names, what the writers publish is in it, and no other module spells a
name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np

from relax_straggler import StragglerConfig
from relax_straggler.common.metric_names import COUNTERS, METRICS, PREFIX, STORE_ROWS
from relax_straggler.common.payload import KERNEL_FIELDS, OP_TYPE_IDS, pack, pack_ops, unpack
from relax_straggler.common.stages import STAGES, stage_id
from relax_straggler.hang.diagnose import diagnose
from relax_straggler.judge import Judge
from relax_straggler.reporters.store_sink import report_rows
import relax_straggler

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "relax_straggler"


def documented(doc: str) -> set[str]:
    """The `straggler/...` names in the first column of the tables of docs/`doc`, a
    placeholder spelled `<rank>` read as `{rank}`."""
    names = set()
    for line in (REPO / "docs" / doc).read_text().splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 2:
            names.update(re.findall(r"`(straggler/[^`]+)`", cells[1]))
    return {re.sub(r"<(\w+)>", r"{\1}", n) for n in names}


def test_docs_metrics_documents_exactly_the_tables_names():
    table = {m.name for m in METRICS}
    assert len(table) == len(METRICS)
    assert documented("METRICS.md") == table


def test_docs_stores_documents_exactly_the_store_rows():
    table = {m.name for m in STORE_ROWS}
    text = re.sub(r"<(\w+)>", r"{\1}", (REPO / "docs" / "STORES.md").read_text())
    assert all(f"`{name}`" in text for name in table), table
    assert documented("STORES.md") <= table


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def test_no_module_but_the_table_spells_a_name():
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "metric_names.py" and path.parent == PACKAGE / "common":
            continue
        tree = ast.parse(path.read_text(), str(path))
        docs = _docstrings(tree)
        for node in ast.walk(tree):  # an f-string's text parts are constants too
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                    and node.value.startswith(PREFIX)):
                spelled.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert not spelled, "\n".join(spelled)


def _matcher(table) -> re.Pattern:
    stage = "|".join(re.escape(s) for s in STAGES)
    parts = [re.escape(m.name).replace(r"\{stage\}", f"(?:{stage})").replace(r"\{rank\}", r"\d+") for m in table]
    return re.compile("|".join(f"(?:{p})" for p in parts))


def _rows(step: int, rng: np.random.Generator, groups: list) -> object:
    forward, backward = stage_id("forward"), stage_id("backward")
    out = []
    for rank in range(8):
        device = np.full(len(STAGES), np.nan)
        device[forward] = 10 + rng.random() + (8 if rank == 5 and step > 3 else 0)
        device[backward] = 20 + rng.random()
        kernel = np.full((len(STAGES), len(KERNEL_FIELDS)), np.nan)
        kernel[forward] = (8.0, 1.5, 0.5)
        out.append(pack(step, np.nan, rank, device, device, np.zeros(len(STAGES)), np.ones(len(STAGES)), (),
                        groups[rank], kernel=kernel))
    return unpack(np.stack(out))


def _ops() -> np.ndarray:
    ops = [("forward-compute", 0.0, 0.01), ("backward-compute", 0.01, 0.02), ("optimizer", 0.03, 0.01)]
    arr = np.array([(OP_TYPE_IDS[n], -1, -1, s, d) for n, s, d in ops], dtype=np.float64)
    return pack_ops(9, 0, 0, 0, 0, 0, 1.0, arr, 16)[None, :]


def test_everything_the_writers_publish_is_in_the_table():
    published: set[str] = set()
    for groups in ([None] * 8, [0, 0, 1, 1, 2, 2, 3, 3]):
        rng = np.random.default_rng(1)
        judge = Judge(StragglerConfig(enabled=True, kernel_stats=True, window_every=4, window_size=8))
        for step in range(1, 10):
            report = judge.report(_rows(step, rng, groups), _ops(), step, {"dropped_reports": 0, "store_written_rows": 0})
            published.update(report.metrics)
            published.update(report_rows(report, "j", 1.0, ["n"] * 8).column("metric_name").to_pylist())
    snapshots = {r: {"rank": r, "step": 4, "wall": 0.0, "stalled_s": 9.0, "groups": []} for r in range(2)}
    published.update(diagnose(snapshots, range(3)).metrics())
    ours = {n for n in published if n.startswith(PREFIX)}
    assert {"straggler/window/steps", "straggler/verdict/status", "straggler/whatif/slowdown",
            "straggler/hang/answer", "straggler/forward/kernel_ms", "straggler/verdict"} <= ours
    metrics, rows = _matcher(METRICS), _matcher(STORE_ROWS)
    assert not [n for n in ours if not (metrics.fullmatch(n) or rows.fullmatch(n))]


def test_the_analyzers_counters_are_the_tables(tmp_path):
    config = StragglerConfig(enabled=True, console=False, store_url=f"file://{tmp_path}?job=j")
    analyzer = relax_straggler.install(None, None, config=config)
    try:
        assert set(analyzer.counters()) == set(COUNTERS)
    finally:
        analyzer.uninstall()
