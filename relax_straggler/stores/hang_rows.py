"""The hang answer as a megatron_metrics row: one format, written by the store sink of the
rank that answered a hang, read back by the monitor (``hang_check.rca``), so the rank and
collective that hold a stopped job reach whoever watches the store.

One row per answer, in rows of the answering rank's analyzed-group rank 0:

    metric_name       iteration               subname                    metric_values
    straggler/hang    the newest step ended   the answer's fields, JSON  HANG_VALUES

The JSON holds every straggler/hang/* field of the answer (docs/METRICS.md) under its
short name (kind, rank, group, group_ranks, op, seq, waiting_ranks, waited_s,
last_completed, no_snapshot_ranks, stalled_s, step, answer); the values repeat the
numeric ones so a plain SQL query can filter on them. Times in s.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping, Optional

import pyarrow as pa

from relax_straggler.common.metric_names import HANG_METRIC, HANG_PREFIX
from relax_straggler.stores.base import Sample, samples_to_table

HANG_VALUES = ("rank", "seq", "waiting_ranks", "waited_s", "stalled_s")
FIELDS = ("kind", "rank", "group", "group_ranks", "op", "seq", "waiting_ranks", "waited_s", "last_completed",
          "no_snapshot_ranks", "stalled_s", "step", "answer")
_INTEGERS = ("rank", "seq", "waiting_ranks", "step")
_NUMBERS = ("waited_s", "stalled_s")


def hang_table(metrics: Mapping[str, Any], job: str, timestamp: float, node: str, cluster: str = "") -> pa.Table:
    """The answer's row (SAMPLE_SCHEMA, one row) from its straggler/hang/* metrics. Raises
    KeyError naming the first field the metrics lack."""
    fields = {name: metrics[HANG_PREFIX + name] for name in FIELDS}
    return samples_to_table([Sample(timestamp, job, HANG_METRIC, 0, int(fields["step"]),
                                    tuple(float(fields[name]) for name in HANG_VALUES),
                                    subname=json.dumps(fields, sort_keys=True), node=node, cluster=cluster)])


def decode(sample: Sample) -> Optional[dict[str, Any]]:
    """The answer `sample` holds ({FIELDS..., "answered_at": s since the epoch}); None for
    any other metric. Raises ValueError naming the row (and the field) when its subname is
    not the JSON object of FIELDS with integers, numbers and strings where they belong."""
    if sample.metric_name != HANG_METRIC:
        return None
    where = f"{HANG_METRIC} row of job {sample.job!r}, iteration {sample.iteration}"
    try:
        fields = json.loads(sample.subname)
    except ValueError as exc:
        raise ValueError(f"{where}: subname is not JSON ({exc})") from None
    if not isinstance(fields, dict):
        raise ValueError(f"{where}: subname is not a JSON object")
    missing = [name for name in FIELDS if name not in fields]
    if missing:
        raise ValueError(f"{where}: subname lacks {', '.join(missing)}")
    for name in FIELDS:
        value = fields[name]
        if name in _INTEGERS:
            ok, want = type(value) is int, "an integer"
        elif name in _NUMBERS:
            ok, want = type(value) in (int, float) and math.isfinite(value), "a finite number of s"
        else:
            ok, want = isinstance(value, str), "a string"
        if not ok:
            raise ValueError(f"{where}: {name} must be {want}, got {json.dumps(value)[:40]}")
    return {**{name: fields[name] for name in FIELDS}, "answered_at": sample.timestamp}


def latest_answer(samples: Iterable[Sample], since_step: int = -1) -> Optional[dict[str, Any]]:
    """The newest answer (by timestamp) among `samples` about step >= since_step; None
    without one. Raises ValueError for a malformed hang row (decode)."""
    answers = [a for a in map(decode, samples) if a is not None and a["step"] >= since_step]
    return max(answers, key=lambda a: a["answered_at"], default=None)
