"""WindowDetector: the window detector run live on the metrics rank, every K reports.

It keeps the judged matrices of the last `window` reports (bounded, oldest dropped) and,
on every `every`-th report, runs relax_straggler.window.detector.window over them and returns
metrics to merge into that report's metrics::

    detector = WindowDetector(window=100, every=10)
    for report in reports:                      # on the report thread
        report.metrics.update(detector.observe(report))

Metrics (all under ``straggler/window/``; see detect.WindowResult.metrics):
  anomaly_ranks, num_anomalies, votes/<rank>, stages/<rank>, link_suspects,
  anomaly_nodes (with a node map), imbalance/<stage> (with a group map), steps, elapsed_ms.

The measured `untimed` stage (time outside every section) is left out: a sub-millisecond,
scheduling-noisy column would dilute the clusterers' "slow in half the stages" rule, and
the confirmed verdict judges it report by report and by its sequential test.
Reports may name different stage subsets (a stage no rank ran is left out of a report):
the window is laid out over the union, in relax_straggler.common.stages order, with NaN where
a report lacked a stage. A change in the number of ranks starts a new window.
Not thread-safe: call observe from one thread (the report thread).
Memory: the window holds `window` copies of judged_ms (ranks x stages float64) and an
analysis stacks them once more: at 16,384 ranks x 12 stages and window=100, 2 x 157 MB.
"""

from __future__ import annotations

import collections
import logging
from typing import Any, Deque, Optional, Sequence

import numpy as np

from relax_straggler.common.stages import MEASURED_STAGES, STAGE_IDS
from relax_straggler.common.validators import require_int, require_window_size
from relax_straggler.window.detector import WindowConfig, WindowResult
from relax_straggler.window.detector import window as detect_window

log = logging.getLogger(__name__)


class WindowDetector:
    """Runs the window detector over the last `window` reports every `every` reports.

    window: reports kept (>= 2). every: reports between analyses (>= 1); the first runs
    once `every` reports are held. skip_reports: reports ignored at the start of the run
    (warm-up); the analysis itself then uses warmup_steps = 0, since the window holds only
    sampled steps past warm-up. config: detector settings (its warmup_steps is replaced).
    rank_to_node / rank_to_group: as in detect.window.
    Raises ValueError on invalid arguments.
    """

    def __init__(self, window: int = 100, every: int = 10, skip_reports: int = 0,
                 config: Optional[WindowConfig] = None, rank_to_node: Optional[Sequence[int]] = None,
                 rank_to_group: Optional[Sequence[int]] = None) -> None:
        require_window_size(window, "window")
        require_int(every, "every", 1)
        require_int(skip_reports, "skip_reports", 0)
        self.window = window
        self.every = every
        self.skip_reports = skip_reports
        self.config = (config or WindowConfig()).replace(warmup_steps=0)
        self.config.native()  # validate now, not on the first analysis
        self.rank_to_node = None if rank_to_node is None else list(rank_to_node)
        self.rank_to_group = None if rank_to_group is None else list(rank_to_group)
        self._held: Deque[tuple[int, tuple[str, ...], np.ndarray]] = collections.deque(maxlen=window)
        self._seen = 0
        self._since = 0
        self.last_result: Optional[WindowResult] = None

    def observe(self, report: Any) -> dict[str, Any]:
        """Adds one report (uses report.step, report.stages, report.judged_ms (ranks,
        stages) in ms). Returns the window metrics when this report triggers an analysis,
        else an empty dict."""
        self._seen += 1
        if self._seen <= self.skip_reports:
            return {}
        judged = np.asarray(report.judged_ms, dtype=np.float64)
        stages = tuple(report.stages)
        if judged.ndim != 2 or judged.shape[1] != len(stages):
            raise ValueError(f"report {report.step}: judged_ms has shape {judged.shape} for {len(stages)} stages")
        if self._held and self._held[-1][2].shape[0] != judged.shape[0]:
            log.warning("relax_straggler: step %d: %d ranks after %d; starting a new window", report.step,
                        judged.shape[0], self._held[-1][2].shape[0])
            self._held.clear()
            self._since = 0
        kept = [i for i, s in enumerate(stages) if s not in MEASURED_STAGES]
        self._held.append((int(report.step), tuple(stages[i] for i in kept), judged[:, kept].copy()))
        self._since += 1
        if self._since < self.every or len(self._held) < min(self.every, self.window):
            return {}
        self._since = 0
        ms, names = self._stack()
        # The analyzer's comparison groups (pipeline stages) when no map was given.
        groups = self.rank_to_group if self.rank_to_group is not None else getattr(report, "groups", None)
        self.last_result = detect_window(ms, names, self.config, rank_to_node=self._map(self.rank_to_node, ms),
                                         rank_to_group=self._map(groups, ms))
        return self.last_result.metrics()

    def _stack(self) -> tuple[np.ndarray, list[str]]:
        """(steps, ranks, union of stages) in ms, NaN where a report lacked a stage."""
        names = {s for _, stages, _ in self._held for s in stages}
        union = sorted(names, key=lambda s: (STAGE_IDS.get(s, len(STAGE_IDS)), s))
        column = {s: j for j, s in enumerate(union)}
        ranks = self._held[0][2].shape[0]
        out = np.full((len(self._held), ranks, len(union)), np.nan)
        for i, (_, stages, judged) in enumerate(self._held):
            out[i][:, [column[s] for s in stages]] = judged
        return out, union

    @staticmethod
    def _map(values: Optional[list[int]], ms: np.ndarray) -> Optional[list[int]]:
        # A map for another world size (ranks changed) cannot be applied: drop it, loudly.
        if values is None or len(values) == ms.shape[1]:
            return values
        log.warning("relax_straggler: rank map has %d entries for %d ranks; ignoring it", len(values), ms.shape[1])
        return None
