"""A user callback `report_fn(metrics: dict, step: int)`, and Relax's tracking adapter."""

from __future__ import annotations

from typing import Any, Callable

from relax_straggler.report import Report

ReportFn = Callable[[dict[str, Any], int], None]


class CallbackSink:
    """Calls report_fn(report.metrics, report.step) on the report thread."""

    def __init__(self, report_fn: ReportFn) -> None:
        self._fn = report_fn

    def __call__(self, report: Report) -> None:
        self._fn(report.metrics, report.step)

    def __repr__(self) -> str:
        return f"CallbackSink({getattr(self._fn, '__qualname__', self._fn)!r})"


def relax_tracking_report_fn(args: Any, step_key: str = "train/step") -> ReportFn:
    """report_fn that logs through Relax's `tracking_utils.log(args, metrics, step_key)`.

    The step travels inside the dict under step_key, as Relax expects. Raises ImportError
    when Relax is not importable.
    """
    from relax.utils import tracking_utils  # imported lazily: Relax is optional

    def report_fn(metrics: dict[str, Any], step: int) -> None:
        tracking_utils.log(args, {**metrics, step_key: step}, step_key=step_key)

    return report_fn
