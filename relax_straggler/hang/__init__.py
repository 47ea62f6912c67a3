"""When the job stops: name the rank and the collective that hold it (docs/DESIGN.md,
"When the job stops"; metrics straggler/hang/*, docs/METRICS.md).

diagnose    compares per-rank progress snapshots (pure, no torch)
channel     the c10d store the snapshots travel through
watchdog    the per-rank thread that notices a stop and answers
publish     the answer as a HangEvent for the sinks
flight_recorder  the same answer from PyTorch Flight Recorder dumps (fr_dumps reads them,
            slow_collectives the duration evidence beside it), for `relax-straggler analyze`
"""

from relax_straggler.hang.diagnose import (ANALYZER, DESYNC, LAGGING, MISSING, NONE, Finding, HangAnswer, compact,
                                           diagnose)

__all__ = ["ANALYZER", "DESYNC", "LAGGING", "MISSING", "NONE", "Finding", "HangAnswer", "compact", "diagnose"]
