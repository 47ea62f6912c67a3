"""The record of one job the monitor watches, and the limit on how many it watches."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from relax_straggler.common.topology import Topology
from relax_straggler.monitor.trigger import IterationRange, JobDetector, TriggerConfig

# Status changes kept per job (oldest dropped).
MAX_TRANSITIONS = 50


@dataclass
class JobRecord:
    """One registered job. results: finished analyses, oldest first (range_analysis dicts);
    pending: the window being analysed; error: why the last analysis failed, if it did;
    transitions: [[s since the epoch, status], ...], each change of status the monitor saw;
    poll_error: why the last read of its iterations failed, or that it skipped damaged data
    (store_problems), None after a good one (not saved);
    store_problems: damage the store skipped in the job's data (Store.job_problems; not saved);
    hang_answer: while it hangs, the job's own answer of which rank and collective hold it
    (relax_straggler.stores.hang_rows), once it is in the store (not saved: read again);
    end: the job's end-of-run row (stores.end_rows.decode) while it is finished."""

    job_id: str
    registered_at: float
    topology: Optional[Topology]
    detector: JobDetector
    results: list = field(default_factory=list)
    pending: Optional[IterationRange] = None
    error: Optional[str] = None
    transitions: list = field(default_factory=list)
    in_flight: bool = False  # an analysis of `pending` is queued or running (not saved)
    poll_error: Optional[str] = None
    store_problems: list = field(default_factory=list)
    hang_answer: Optional[dict] = None
    end: Optional[dict] = None
    end_error: Optional[str] = None  # why its end-of-run row could not be read, logged once (not saved)

    def note_status(self, now: float) -> bool:
        """Records the status at `now` when it changed; True if it did."""
        status = self.detector.status(now)
        if self.transitions and self.transitions[-1][1] == status:
            return False
        self.transitions.append([now, status])
        del self.transitions[:-MAX_TRANSITIONS]
        return True

    def to_dict(self) -> dict:
        """A snapshot (copies of the lists: it is written out after the lock is released)."""
        return {"registered_at": self.registered_at,
                "topology": None if self.topology is None else asdict(self.topology),
                "detector": self.detector.to_dict(), "results": list(self.results),
                "pending": None if self.pending is None else [self.pending.first_iteration,
                                                              self.pending.last_iteration],
                "error": self.error, "transitions": [list(t) for t in self.transitions], "end": self.end}

    @classmethod
    def from_dict(cls, job_id: str, raw: dict, trigger: TriggerConfig) -> "JobRecord":
        """The record to_dict() gave, with its "seen" [iteration, s] (the state journal's
        newest arrival) restored when present. Raises KeyError, TypeError, ValueError,
        AttributeError, IndexError or OverflowError for a malformed one."""
        topo = raw["topology"]
        pending = raw["pending"]
        record = cls(job_id, float(raw["registered_at"]), None if topo is None else Topology(**topo),
                     JobDetector.from_dict(trigger, raw["detector"]), list(raw["results"]),
                     None if pending is None else IterationRange(int(pending[0]), int(pending[1])),
                     raw["error"], list(raw["transitions"]), end=raw.get("end"))
        record.detector.predicting = record.pending is not None
        if "seen" in raw:
            record.detector.restore_seen(int(raw["seen"][0]), float(raw["seen"][1]))
        return record


class JobLimitError(Exception):
    """A registration beyond MonitorConfig.max_jobs; str() says the limit."""
