"""What-if slowdown analysis: how much slower the job runs than without stragglers, and
what fixing a dp_rank, stage, op type or worker would give back (the OSDI'25 what-if
study, replayed by the C++ engine). See docs/WHATIF.md."""

from relax_straggler.whatif.errors import WhatIfInputError
from relax_straggler.whatif.loader import OpInput, OpRecords, load_op_records, read_op_input
from relax_straggler.whatif.result import WhatIfReport, analyze_records, run_whatif

__all__ = ["OpInput", "OpRecords", "WhatIfInputError", "load_op_records", "read_op_input", "WhatIfReport",
           "analyze_records", "run_whatif"]
