"""relax_straggler: find the rank, the stage and the cause that slow distributed training.

    import relax_straggler
    analyzer = relax_straggler.install(model, optimizer)
    with analyzer.section("data"):
        batch = next(loader)

See README.md and docs/ for the metrics and the design.
"""

from relax_straggler.analyzer import Analyzer, NullAnalyzer, install, section
from relax_straggler.config import StragglerConfig, add_arguments, from_args
from relax_straggler.report import Report
from relax_straggler.stages import STAGES

__version__ = "0.1.0"

__all__ = ["Analyzer", "NullAnalyzer", "Report", "STAGES", "StragglerConfig", "add_arguments", "from_args",
           "install", "section", "__version__"]
