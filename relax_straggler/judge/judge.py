"""The Judge: one sampled step's gathered rows to one whole Report, on the metrics rank's
report thread (never the training thread)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from relax_straggler.common import thresholds
from relax_straggler.common.payload import Gathered
from relax_straggler.common.stages import STAGES
from relax_straggler.config import StragglerConfig
from relax_straggler.judge.columns import all_stages, kernel_all_stages
from relax_straggler.judge.confirm import ConfirmConfig, ConfirmedVerdict
from relax_straggler.judge.history import ConfigHistory
from relax_straggler.judge.report import Report, build_report
from relax_straggler.whatif.live import LiveWhatIf


class Judge:
    """Judges a run's sampled steps in step order, each once, from its gathered rows.

    Per step: the per-step rule (relax_straggler.judge.report.build_report: slow if
    t >= ref x relative or t - ref >= absolute ms, with the step's config's thresholds,
    late arrivals, the loss counters), then, across reports, the confirmed verdict
    (relax_straggler.judge.confirm: the window ensemble as its second witness, the kernel,
    run-queue and GC causes, the confirmed rank's stack) and the live what-if of the step's
    per-op rows. The confirmed verdict starts over when a threshold change
    reaches the steps judged: its evidence was weighed against the old bar.

    config: the run's StragglerConfig; rank_to_node: node id per rank for the window
    ensemble, or None. Raises ValueError on an invalid config. Not thread-safe but for
    control (the training thread) beside report (the report thread).
    """

    def __init__(self, config: StragglerConfig, rank_to_node: Optional[Sequence[int]] = None) -> None:
        self._history = ConfigHistory(config)
        self._rank_to_node = rank_to_node
        self._verdict = ConfirmedVerdict(ConfirmConfig.from_config(config), rank_to_node)
        self._whatif = LiveWhatIf()

    def control(self, from_step: int, changes: Mapping[str, Any]) -> None:
        """A runtime-control command's changes (StragglerConfig field -> value) from step
        `from_step` (the analyzer's count) on: its thresholds (common.thresholds.FIELDS)
        judge the steps from then on; the other fields are the training side's and ignored
        here. Raises ValueError for an
        invalid threshold."""
        changed = {k: v for k, v in changes.items() if k in thresholds.FIELDS}
        if changed:
            self._history.change(from_step, changed)

    def report(self, gathered: Gathered, op_rows: np.ndarray, step: int, counters: Mapping[str, Any],
               label: Optional[int] = None) -> Report:
        """The Report of one sampled step. gathered: every rank's unpacked row of step `step`
        (the analyzer's count, which every judged row carries); op_rows: the per-op rows
        gathered with them, (ranks, op row length) float64, (ranks, 0) without per-op
        records; counters: the loss counters to publish (name -> count, under straggler/);
        label: the step's number in the report and its messages, default step. Its metrics
        are the per-step rule's, the confirmed verdict's (straggler/verdict/*), the window
        ensemble's when it ran on this report and the live what-if's; its verdict is the
        confirmed verdict after it. Raises ValueError on malformed rows."""
        config = self._history.at(step)
        step_report = build_report(gathered, step, config, config.metrics_rank, dict(counters), label=label)
        wanted = ConfirmConfig.from_config(config)
        if wanted != self._verdict.config:
            self._verdict = ConfirmedVerdict(wanted, self._rank_to_node)
        # One stage layout for every report (all of STAGES): a stage run on some steps only
        # must not start the verdict over.
        kernel = None if step_report.kernel is None else kernel_all_stages(step_report.kernel, step_report.stages)
        verdict = self._verdict.update(step_report.step, all_stages(step_report.judged_ms, step_report.stages), STAGES,
                                       groups=step_report.groups, kernel=kernel, run_queue_ms=step_report.run_queue_ms,
                                       gc=step_report.gc, stacks=step_report.stacks)
        window = {} if verdict.window is None else verdict.window.metrics()
        metrics = {**step_report.metrics, **verdict.metrics(), **window, **self._whatif.metrics(op_rows)}
        return dataclasses.replace(step_report, metrics=metrics, verdict=verdict)
