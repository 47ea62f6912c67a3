"""The end-of-run row: one format, written when a job ends normally (the live store sink at
uninstall(), `relax-straggler feed` at its end), read back by the monitor, which then
shows the job `finished` instead of `hanging` once its iterations stop.

One row per end, in rows of rank 0:

    metric_name     iteration            subname          metric_values
    straggler/end   the last step seen   how it ended     END_VALUES

How it ended is one of REASONS. A job that stops without this row (a crash, a kill, a
hang) has none, and the monitor keeps calling it hanging.
"""

from __future__ import annotations

from typing import Iterable, Optional

import pyarrow as pa

from relax_straggler.common.metric_names import END_METRIC
from relax_straggler.stores.base import Sample, samples_to_table

END_VALUES = ("last_step", "steps")
# uninstall: the live analysis was uninstalled (the integrations do it on their exit paths);
# replay: the feed (relax_straggler.monitor.feed) wrote its last iteration; the reason keeps
# the command's old name, which the stored rows carry.
REASONS = ("uninstall", "replay")


def end_table(job: str, last_step: int, steps: int, reason: str, timestamp: float, node: str = "",
              cluster: str = "") -> pa.Table:
    """The end row (SAMPLE_SCHEMA, one row). last_step: the newest step the job reported (0
    when none); steps: how many it reported. Raises ValueError for a reason outside REASONS
    or negative counts."""
    if reason not in REASONS:
        raise ValueError(f"end row: reason {reason!r} is not one of {', '.join(REASONS)}")
    if last_step < 0 or steps < 0:
        raise ValueError(f"end row: last_step and steps must be >= 0, got {last_step}, {steps}")
    return samples_to_table([Sample(timestamp, job, END_METRIC, 0, int(last_step), (float(last_step), float(steps)),
                                    subname=reason, node=node, cluster=cluster)])


def decode(sample: Sample) -> Optional[dict]:
    """{"reason", "last_step", "steps", "ended_at" (s since the epoch)} of an end row; None
    for any other metric. Raises ValueError naming the row when it does not follow the format."""
    if sample.metric_name != END_METRIC:
        return None
    where = f"{END_METRIC} row of job {sample.job!r}, iteration {sample.iteration}"
    if sample.subname not in REASONS:
        raise ValueError(f"{where}: subname {sample.subname!r} is not one of {', '.join(REASONS)}")
    if len(sample.values) != len(END_VALUES):
        raise ValueError(f"{where}: {len(sample.values)} values, expected {len(END_VALUES)} ({', '.join(END_VALUES)})")
    return {"reason": sample.subname, "last_step": sample.iteration, "steps": int(sample.values[1]),
            "ended_at": sample.timestamp}


def latest_end(samples: Iterable[Sample]) -> Optional[dict]:
    """The newest end row among `samples` (any metrics), None without one. Raises ValueError
    for a malformed end row (decode)."""
    ends = [e for e in map(decode, samples) if e is not None]
    return max(ends, key=lambda e: (e["last_step"], e["ended_at"])) if ends else None
