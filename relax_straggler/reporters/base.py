"""The sink contract: what every report sink (console, JSONL, callback, store, the run
summary, the narrator) is given and how it ends.

A sink gets two kinds of item, each through its own method: a sampled step's Report
(`write`) and a stopped job's answer (`write_hang`, a HangEvent). `close(timeout_s)` ends
it, bounded by timeout_s seconds. Calls come from the metrics rank's report thread and,
for a hang, from the watchdog thread (docs/ARCHITECTURE.md invariant 5): never from the
training thread.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Mapping

from relax_straggler.judge.report import Report

CLOSE_TIMEOUT_S = 30.0  # close()'s bound when the caller gives none, seconds


@dataclass(frozen=True)
class HangEvent:
    """A stopped job's answer (relax_straggler.hang), once per hang. step: the newest step
    ended; answer: the findings in words; metrics: straggler/hang/* (docs/METRICS.md),
    `straggler/hang/answer` holding the same words."""

    step: int
    answer: str
    metrics: Mapping[str, Any]


class Sink(abc.ABC):
    """A destination of reports. A sink may raise from write / write_hang: the caller logs
    it and the other sinks still get the item; close() never raises for the sink's own
    output failing (it logs)."""

    @abc.abstractmethod
    def write(self, report: Report) -> None:
        """Takes one sampled step's report (reports arrive in step order)."""

    @abc.abstractmethod
    def write_hang(self, event: HangEvent) -> None:
        """Takes a stopped job's answer (no stage rows)."""

    @abc.abstractmethod
    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Delivers what the sink still holds, within timeout_s seconds, and releases it;
        nothing is written after."""
