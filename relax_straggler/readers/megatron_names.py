"""Timer names of recorded runs (Megatron timer logs, traces, store rows) -> the columns
a reader fills: a STAGES column and optionally a P2P_OPS column.

The meaning of every name is relax_straggler.common.megatron_timers' (docs/ANALYZE.md has the
table). A reader sums recorded times, so a timer that is part of another timer of the same
stage (optimizer-*, inside optimizer) is excluded like the timers that are not a stage
(forward-backward, interval-time, checkpointing, ...): counted in the output, never added
twice. Any other name is unknown and reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from relax_straggler.common.megatron_timers import timer_meaning
from relax_straggler.common.stages import STAGE_IDS
from relax_straggler.readers.base import P2P_OPS


@dataclass(frozen=True)
class TimerTarget:
    """Where a timer's time goes: a STAGES column and optionally a P2P_OPS column.
    stage None means known and excluded."""

    stage: Optional[int]
    p2p: Optional[int] = None


EXCLUDED = TimerTarget(None)


def timer_target(name: str) -> Optional[TimerTarget]:
    """The target of a recorded timer name; None when the name is unknown."""
    meaning = timer_meaning(name)
    if meaning is None:
        return None
    if meaning.stage is None or meaning.part_of is not None:
        return EXCLUDED
    return TimerTarget(STAGE_IDS[meaning.stage], None if meaning.p2p is None else P2P_OPS.index(meaning.p2p))
