"""Why the analysis stopped: one failure of the analyzer's side group, as the rank that saw it
names it. Its rank, code and step travel as numbers (in a gathered row, in the metrics
rank's decision), so every rank can name the same failure; the error text stays with the
rank that saw it.
"""

from __future__ import annotations

from dataclasses import dataclass

GATHER_FAILED = 1  # a gather of the rank raised (a peer gone: Gloo reports the closed connection)
GATHER_STUCK = 2  # a gather of the rank stayed unfinished (a peer stopped, died or fell far behind)
DECISION_LATE = 3  # the metrics rank's decision had not come when it was due
DECISION_FAILED = 4  # the broadcast carrying the metrics rank's decision raised

_WHAT = {
    GATHER_FAILED: "rank {rank}'s side-group gather of step {step} failed",
    GATHER_STUCK: "rank {rank}'s side-group gather of step {step} never finished (a rank of the group stopped, "
                  "died or fell far behind)",
    DECISION_LATE: "the metrics rank's decision due at step {step} never reached rank {rank} (the metrics rank, or a "
                   "rank on the broadcast's way, stopped, died or fell far behind)",
    DECISION_FAILED: "the metrics rank's decision due at step {step} failed to reach rank {rank}",
}


@dataclass(frozen=True)
class SideFailure:
    """rank: the global rank that saw the failure; code: one of the codes above; step: the
    step of the collective concerned; detail: the error or the measured wait, known only on
    the rank that saw it ("" elsewhere)."""

    rank: int
    code: int
    step: int
    detail: str = ""

    def __post_init__(self) -> None:
        if self.code not in _WHAT:
            raise ValueError(f"unknown side-group failure code {self.code!r}")

    def describe(self) -> str:
        """One line for a warning: "rank 3's side-group gather of step 12 failed (...)"."""
        text = _WHAT[self.code].format(rank=self.rank, step=self.step)
        return f"{text} ({self.detail})" if self.detail else text

    def same(self, other: "SideFailure") -> bool:
        """Whether `other` is this failure, as it travelled (without the detail)."""
        return (self.rank, self.code, self.step) == (other.rank, other.code, other.step)
