"""The package's import graph: no cycle, and no import climbs from a lower layer to a
higher one (docs/ARCHITECTURE.md, "Python layers"). Lazy imports inside functions count:
they are dependencies all the same.

    .venv/bin/python -m pytest tests/python/test_layers.py -q
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "relax_straggler"

# Top-level modules and subpackages of relax_straggler, lowest layer first (the layers of
# docs/ARCHITECTURE.md). A module may import its own layer and the ones below it.
LAYERS: tuple[frozenset[str], ...] = (
    # vocabulary and plain data (common/) and the extension's loading: nothing of ours below them
    frozenset({"", "_ext", "common"}),
    # configuration and the metrics stores
    frozenset({"config", "stores"}),
    # the torch-free judge: the per-step report, the confirmed verdict, the window detector,
    # what-if, readers of recorded runs
    frozenset({"judge", "window", "whatif", "readers"}),
    # the training side (collection, the side-group gather, the live analyzer) and the sinks
    frozenset({"live", "reporters", "hang"}),
    # offline analysis and the monitor service
    frozenset({"analysis", "monitor"}),
    # entry points and adapters
    frozenset({"integrations", "demo", "cli"}),
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(("relax_straggler",) + parts)] = path
    return found


def _runtime_nodes(tree: ast.AST):
    """Every node except those under `if TYPE_CHECKING:` (type hints, never imported)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                todo.extend(child.orelse)
            else:
                todo.append(child)


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    deps = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            deps.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # `from relax_straggler import detect` imports the module
                sub = f"{target}.{alias.name}"
                deps.add(sub if sub in known else target)
    return {d for d in deps if d in known and d != module}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {m: _imports(m, p, known) for m, p in modules.items()}


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for i, members in enumerate(LAYERS):
        if top in members:
            return i
    raise AssertionError(f"{module} is in no layer: add {top!r} to LAYERS and to docs/ARCHITECTURE.md")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer():
    for module in _graph():
        _layer(module)


def test_the_import_graph_has_no_cycle():
    assert _cycles(_graph()) == []


def test_no_import_climbs_to_a_higher_layer():
    climbs = [f"{m} (layer {_layer(m)}) imports {d} (layer {_layer(d)})"
              for m, deps in sorted(_graph().items()) for d in sorted(deps) if _layer(d) > _layer(m)]
    assert climbs == []


def test_the_checks_see_a_cycle_and_a_climb():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _layer("relax_straggler.cli.analyze") > _layer("relax_straggler.stores.base")


TORCH_FREE = ["relax_straggler.config", "relax_straggler.analysis", "relax_straggler.judge",
              "relax_straggler.window.live", "relax_straggler.window.ensemble", "relax_straggler.monitor.service",
              "relax_straggler.reporters", "relax_straggler.reporters.store_sink", "relax_straggler.stores",
              "relax_straggler.readers"] + sorted(
    f"relax_straggler.common.{p.stem}" for p in (PACKAGE / "common").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("module", TORCH_FREE)
def test_offline_and_reporting_modules_start_without_torch(module):
    code = f"import sys, {module}; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, f"{module} imports torch"


def test_the_judge_judges_where_torch_cannot_be_imported():
    # torch absent, not merely unused: any import of it, however indirect, raises.
    code = """
import sys
sys.modules["torch"] = None
import numpy as np
from relax_straggler.common.payload import pack, unpack
from relax_straggler.common.stages import STAGES
from relax_straggler.config import StragglerConfig
from relax_straggler.judge import Judge
rows = []
for rank in range(4):
    device = np.full(len(STAGES), np.nan)
    device[0] = 80.0 if rank == 2 else 40.0
    rows.append(pack(10, np.nan, rank, device, device, np.zeros(len(STAGES)), np.ones(len(STAGES))))
report = Judge(StragglerConfig(enabled=True)).report(unpack(np.stack(rows)), np.zeros((4, 0)), 10, {})
sys.exit(0 if report.stragglers["forward"] == (2,) and report.verdict is not None else 1)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
