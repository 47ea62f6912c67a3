"""The step x rank picture of an analysed window: what the status page draws (an inline SVG),
kept with the newest analysis of each job only.

The values are each rank's ms in the verdict's stage (the sum of its compute stages, forward
+ backward + optimizer, when no stage is named), one row per step of the window. A job of
more than MAX_COLUMNS ranks is drawn in MAX_COLUMNS columns of consecutive ranks, each the
slowest rank of its column (a straggler stays visible), so the picture stays small
whatever the job's size: steps x MAX_COLUMNS numbers.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from relax_straggler.common.stages import STAGE_IDS
from relax_straggler.readers.base import StepTimes

MAX_COLUMNS = 128
_COMPUTE = [STAGE_IDS[s] for s in ("forward", "backward", "optimizer")]


def window_picture(steps: Sequence[StepTimes], stage: Optional[str]) -> Optional[dict]:
    """{"stage" (the stage drawn, or "compute"), "steps": [iteration...], "columns": [[first
    rank, last rank]...], "ms": [[ms or None per column] per step]} of `steps`; None
    without steps or ranks."""
    if not steps:
        return None
    world = max(int(s.ranks.max()) + 1 for s in steps if len(s.ranks)) if any(len(s.ranks) for s in steps) else 0
    if world == 0:
        return None
    width = min(world, MAX_COLUMNS)
    per = math.ceil(world / width)
    width = math.ceil(world / per)
    column = stage if stage in STAGE_IDS else None
    rows = []
    for s in steps:
        values = s.ms[:, STAGE_IDS[column]] if column else np.where(
            np.isfinite(s.ms[:, _COMPUTE]).any(axis=1), np.nansum(s.ms[:, _COMPUTE], axis=1), np.nan)
        full = np.full(width * per, np.nan)
        full[s.ranks] = values
        with np.errstate(all="ignore"):
            bucketed = np.fmax.reduce(full.reshape(width, per), axis=1)
        rows.append([round(float(v), 3) if math.isfinite(v) else None for v in bucketed])
    return {"stage": column or "compute", "steps": [int(s.step) for s in steps],
            "columns": [[i * per, min(world, (i + 1) * per) - 1] for i in range(width)], "ms": rows}
