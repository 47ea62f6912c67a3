"""relax_straggler: find the rank, the stage and the cause that slow distributed training.

    import relax_straggler
    analyzer = relax_straggler.install(model, optimizer)
    with analyzer.section("data"):
        batch = next(loader)

See README.md and docs/ for the metrics and the design. The public names load on first
use, so the offline analysis and the monitor service (which never need torch) start
without importing it.
"""

import importlib as _importlib
from typing import Any as _Any

__version__ = "0.1.0"

# Public name -> the module that defines it.
_EXPORTS = {
    "Analyzer": "relax_straggler.live.analyzer",
    "NullAnalyzer": "relax_straggler.live.analyzer",
    "install": "relax_straggler.live.analyzer",
    "JoinTimeout": "relax_straggler.live.join",
    "section": "relax_straggler.live.analyzer",
    "StragglerConfig": "relax_straggler.config",
    "add_arguments": "relax_straggler.config",
    "from_args": "relax_straggler.config",
    "Report": "relax_straggler.judge.report",
    "STAGES": "relax_straggler.common.stages",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> _Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'relax_straggler' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
