"""The confirmed verdict over a recorded run: the live analyzer's decision
(relax_straggler.judge.confirm) fed the input's per-rank steps in order, ranks compared within
their pipeline stage, so `analyze` and the monitor name a straggler the way the training
job would have."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Optional

import numpy as np

from relax_straggler.analysis.config import AnalyzeConfig
from relax_straggler.common.stages import STAGES
from relax_straggler.judge.confirm import ConfirmConfig, ConfirmedVerdict


@dataclass(frozen=True)
class ConfirmedStraggler:
    """A (rank, stage) the verdict confirmed: since_step: its first confirmation; steps: steps
    that named it; ratio: the finding's ratio (relax_straggler.judge.confirm.Finding.ratio, one
    definition in docs/METRICS.md) in the last step that named it; cause: the inferred cause
    most often given; last_step: the last step that named it; to_end: whether the input's
    last step still named it (else the verdict released it after last_step)."""

    rank: int
    stage: str
    since_step: int
    steps: int
    ratio: float
    cause: str
    last_step: int
    to_end: bool


@dataclass(frozen=True)
class ConfirmedImbalance:
    """A compute stage the verdict found imbalanced (a whole pipeline stage slower): group:
    the slowest comparison group (pipeline stage) in the last step that named it; since_step:
    when the imbalance was first confirmed; steps: steps that named it; ratio: the finding's
    ratio (the listed group's work over the fastest group's, docs/METRICS.md) in the last
    step that named it."""

    group: int
    stage: str
    since_step: int
    steps: int
    ratio: float


@dataclass(frozen=True)
class ConfirmedSummary:
    """statuses: steps per state; final_status: the state after the last step;
    stragglers: those the last step still names first, then most steps; imbalance: most
    steps first."""

    statuses: dict[str, int]
    final_status: Optional[str]
    stragglers: tuple[ConfirmedStraggler, ...]
    imbalance: tuple[ConfirmedImbalance, ...] = ()


class ConfirmedTally:
    """Feeds steps (global rank ids, (rows, len(STAGES)) ms, comparison group per row and,
    where the input has them, each row's run-queue wait) to the confirmed verdict and keeps
    counts only (bounded by the findings, not the steps). With the waits, a rank kept waiting
    for a CPU reads cause host_contention, as the live verdict reads it."""

    def __init__(self, config: AnalyzeConfig) -> None:
        self._verdict = ConfirmedVerdict(ConfirmConfig(relative_threshold=config.relative_threshold,
                                                       absolute_ms_threshold=config.absolute_ms_threshold))
        self._statuses: collections.Counter[str] = collections.Counter()
        self._final: Optional[str] = None
        self._found: dict[tuple[int, str], dict] = {}
        self._imbalance: dict[str, dict] = {}  # stage -> group, since, steps, ratio
        self._last_step: Optional[int] = None

    def add(self, step: int, ranks: np.ndarray, ms: np.ndarray, groups: np.ndarray,
            run_queue_ms: Optional[np.ndarray] = None) -> None:
        result = self._verdict.update(step, ms, STAGES, groups=groups.tolist(), run_queue_ms=run_queue_ms)
        self._statuses[result.status] += 1
        self._final, self._last_step = result.status, step
        for f in result.findings:
            if f.state == "imbalance":
                entry = self._imbalance.setdefault(f.stage, {"since": f.since_step, "steps": 0})
                entry.update(group=f.group, ratio=f.ratio, steps=entry["steps"] + 1)
                continue
            if f.state != "straggler" or f.rank < 0:
                continue
            entry = self._found.setdefault((int(ranks[f.rank]), f.stage), {
                "since": f.since_step, "ratio": f.ratio, "causes": collections.Counter()})
            entry["ratio"], entry["last_step"] = f.ratio, step
            entry["causes"][f.cause] += 1

    def summary(self) -> ConfirmedSummary:
        found = [ConfirmedStraggler(rank, stage, e["since"], sum(e["causes"].values()), float(e["ratio"]),
                                    e["causes"].most_common(1)[0][0], e["last_step"], e["last_step"] == self._last_step)
                 for (rank, stage), e in self._found.items()]
        found.sort(key=lambda c: (not c.to_end, -c.steps, c.since_step, c.rank))  # still named at the end first
        imbalance = sorted((ConfirmedImbalance(e["group"], stage, e["since"], e["steps"], float(e["ratio"]))
                            for stage, e in self._imbalance.items()), key=lambda i: (-i.steps, i.since_step, i.stage))
        return ConfirmedSummary(dict(self._statuses), self._final, tuple(found), tuple(imbalance))
