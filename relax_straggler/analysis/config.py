"""Thresholds of offline analysis. The CLI's flags are derived from these fields
(relax_straggler.common.dataclass_flags), one flag per field."""

from __future__ import annotations

from dataclasses import dataclass

from relax_straggler.common import thresholds
from relax_straggler.common.dataclass_flags import flag_field


@dataclass(frozen=True)
class AnalyzeConfig:
    """relative_threshold, absolute_ms_threshold: for the confirmed verdict a time is slow when
    t >= ref x relative or t - ref >= absolute (ms), the slow-rank rule (defaults:
    relax_straggler.common.thresholds); the per-step attribution asks both. min_impact: an excess
    below this fraction of the step time is not flagged by the attribution. p2p_ratio,
    jump_ratio, baseline_ratio, slow_step_ratio, slow_step_window: pipeline send/recv rules
    (csrc/core/attribute/worker_grid.h).
    persistence: fraction of steps a finding must hold in to be an anomaly (else transient).
    ensemble_steps: also run the six-clusterer window detector (relax_straggler.window.detector) on the
    last this many steps and add its votes to the output; 0 = off. Memory: ensemble_steps x
    ranks x 14 stages x 8 bytes."""

    relative_threshold: float = flag_field(
        thresholds.RELATIVE_THRESHOLD,
        "the confirmed verdict: slow when t >= ref x this or t - ref >= --absolute-ms-threshold (the per-step rule); "
        "the per-step attribution asks both, and --min-impact")
    absolute_ms_threshold: float = flag_field(
        thresholds.ABSOLUTE_MS_THRESHOLD, "the excess in ms of --relative-threshold's rules: t - ref >= this")
    min_impact: float = flag_field(0.02, "per-step attribution: also t - ref >= this fraction of the step time")
    p2p_ratio: float = flag_field(1.3, "a p2p time >= its reference x this is abnormal")
    jump_ratio: float = flag_field(2.0, "a p2p time above this x the worker's previous value is a jump")
    baseline_ratio: float = flag_field(2.0, "a worker's mean p2p time above this x the median worker is an outlier")
    slow_step_ratio: float = flag_field(1.25, "PP = 2: a step above this x the rolling median step time is slow")
    slow_step_window: int = flag_field(20, "PP = 2: steps in the rolling median")
    persistence: float = flag_field(0.5, "fraction of steps a finding must hold in to be an anomaly")
    ensemble_steps: int = flag_field(0, "run the six-clusterer window detector on the last N steps (0 = off)")

    def engine_config(self):
        """The relax_straggler._core.AttributionConfig. Raises ValueError naming a bad field."""
        from relax_straggler._ext import core

        if self.ensemble_steps < 0:
            raise ValueError(f"ensemble_steps must be >= 0, got {self.ensemble_steps}")
        return core().AttributionConfig(
            self.relative_threshold, self.absolute_ms_threshold, self.min_impact, self.p2p_ratio, self.jump_ratio,
            self.baseline_ratio, self.slow_step_ratio, self.slow_step_window, self.persistence)
