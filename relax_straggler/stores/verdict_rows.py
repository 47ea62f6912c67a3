"""The live confirmed verdict as megatron_metrics rows: one format, written by the store
sink on the metrics rank, read back by the monitor (the verdict the job itself reached,
with its comparison groups, workloads and window ensemble, which the timer rows alone
cannot rebuild).

Per report, in rows of the metrics rank (rank 0 of the analyzed group; the rank a row is
about is a value, because "nobody" and a stage's imbalance have no rank):

    metric_name                 subname                 metric_values
    straggler/verdict           status|stage|cause      VERDICT_VALUES
    straggler/verdict/finding   state|stage|cause       FINDING_VALUES (one row per finding)

status and state are confirmed-verdict states, stage "none" and cause "none" when all is
healthy; the cause is the inferred one, every value a measured or counted fact. Ranks are
-1 where none is named (straggler/verdict names a rank only in state straggler). Times in ms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from relax_straggler.common.metric_names import FINDING_METRIC, VERDICT_METRIC
from relax_straggler.stores.base import Sample

VERDICT_VALUES = ("rank", "since_step", "confidence", "ratio")
FINDING_VALUES = ("rank", "group", "since_step", "confidence", "ratio", "rank_ms", "ref_ms", "excess_ms",
                  "wait_caused_ms", "reports_agreeing", "reports_seen")
_SEP = "|"  # never in a state, stage or cause name


@dataclass(frozen=True)
class VerdictRow:
    """One decoded row: kind "verdict" (the report's headline) or "finding"."""

    kind: str
    iteration: int
    timestamp: float
    state: str
    stage: str
    cause: str
    values: dict[str, float]


def encode(state: str, stage: str, cause: str, values: Sequence[float], names: Sequence[str]) -> tuple[str, list[float]]:
    """(subname, metric_values) of one row. Raises ValueError when a name holds the
    separator or the values do not match `names` (VERDICT_VALUES or FINDING_VALUES)."""
    for field, text in (("state", state), ("stage", stage), ("cause", cause)):
        if _SEP in text or not text:
            raise ValueError(f"verdict row: {field} {text!r} must be non-empty and without {_SEP!r}")
    if len(values) != len(names):
        raise ValueError(f"verdict row: {len(values)} values for the {len(names)} fields {', '.join(names)}")
    return _SEP.join((state, stage, cause)), [float(v) for v in values]


def decode(sample: Sample) -> Optional[VerdictRow]:
    """The verdict row `sample` holds; None for any other metric. Raises ValueError naming
    the row for a verdict row whose subname or values do not follow the format."""
    kind = {VERDICT_METRIC: "verdict", FINDING_METRIC: "finding"}.get(sample.metric_name)
    if kind is None:
        return None
    names = VERDICT_VALUES if kind == "verdict" else FINDING_VALUES
    parts = sample.subname.split(_SEP)
    where = f"{sample.metric_name} row of job {sample.job!r}, iteration {sample.iteration}"
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"{where}: subname {sample.subname!r} is not state{_SEP}stage{_SEP}cause")
    if len(sample.values) != len(names):
        raise ValueError(f"{where}: {len(sample.values)} values, expected {len(names)} ({', '.join(names)})")
    return VerdictRow(kind, sample.iteration, sample.timestamp, *parts, dict(zip(names, sample.values)))


def latest_verdict(samples: Iterable[Sample]) -> Optional[dict]:
    """The newest iteration's verdict among `samples` (any metrics, any order): {"step",
    "status", "rank", "stage", "cause", "since_step", "confidence", "ratio", "findings":
    [{"state", "rank", "stage", "cause", ...FINDING_VALUES}]}; None without verdict rows.
    Raises ValueError for a malformed verdict row (decode)."""
    rows = [r for r in map(decode, samples) if r is not None]
    heads = [r for r in rows if r.kind == "verdict"]
    if not heads:
        return None
    head = max(heads, key=lambda r: (r.iteration, r.timestamp))
    findings = [r for r in rows if r.kind == "finding" and r.iteration == head.iteration]
    ints = {"rank", "group", "since_step", "reports_agreeing", "reports_seen"}

    def fields(r: VerdictRow) -> dict:
        return {k: int(v) if k in ints else v for k, v in r.values.items()}

    return {"step": head.iteration, "status": head.state, "stage": head.stage, "cause": head.cause,
            **fields(head),
            "findings": [{"state": f.state, "stage": f.stage, "cause": f.cause, **fields(f)} for f in findings]}
