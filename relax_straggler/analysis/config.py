"""Thresholds of offline analysis. The CLI's argument groups mirror these fields one to one."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AnalyzeConfig:
    """relative_threshold, absolute_ms_threshold: a time is slow when t >= ref x relative and
    t - ref >= absolute (ms), the RFC #334 rule. min_impact: an excess below this fraction of
    the step time is not flagged. p2p_ratio, jump_ratio, baseline_ratio, slow_step_ratio,
    slow_step_window: pipeline send/recv rules (csrc/core/attribute/worker_grid.h).
    persistence: fraction of steps a finding must hold in to be an anomaly (else transient).
    ensemble_steps: also run the six-clusterer window detector (relax_straggler.detect) on the
    last this many steps and add its votes to the output; 0 = off. Memory: ensemble_steps x
    ranks x 14 stages x 8 bytes."""

    relative_threshold: float = 1.2
    absolute_ms_threshold: float = 5.0
    min_impact: float = 0.02
    p2p_ratio: float = 1.3
    jump_ratio: float = 2.0
    baseline_ratio: float = 2.0
    slow_step_ratio: float = 1.25
    slow_step_window: int = 20
    persistence: float = 0.5
    ensemble_steps: int = 0

    def engine_config(self):
        """The relax_straggler._core.AttributionConfig. Raises ValueError naming a bad field."""
        from relax_straggler._ext import core

        if self.ensemble_steps < 0:
            raise ValueError(f"ensemble_steps must be >= 0, got {self.ensemble_steps}")
        return core().AttributionConfig(
            self.relative_threshold, self.absolute_ms_threshold, self.min_impact, self.p2p_ratio, self.jump_ratio,
            self.baseline_ratio, self.slow_step_ratio, self.slow_step_window, self.persistence)
