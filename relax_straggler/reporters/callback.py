"""A user callback `report_fn(metrics: dict, step: int)`, Relax's tracking adapter and a
TensorBoard one.

report_fn gets the report's numbers only (int and float values, NaN included), ready for a
metrics logger's scalar call; a report_fn with a parameter named `details` (or **kwargs)
also gets the rest, the strings and lists (the verdict's status, stage and cause, hints,
rank lists), as `details=`.
"""

from __future__ import annotations

import inspect
import numbers
from typing import Any, Callable, Mapping

from relax_straggler.judge.report import Report
from relax_straggler.reporters.base import CLOSE_TIMEOUT_S, HangEvent, Sink

ReportFn = Callable[..., None]


def split_metrics(metrics: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(numbers, details) of one report's metrics: numbers holds the int and float values
    (Python or numpy; bools are details), details everything else."""
    nums: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for key, value in metrics.items():
        is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        (nums if is_number else details)[key] = value
    return nums, details


def takes_details(fn: Callable[..., Any]) -> bool:
    """True when fn has a parameter named `details` or a **kwargs."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: the two-argument form
        return False
    return "details" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class CallbackSink(Sink):
    """Calls report_fn(numbers, step) on the report thread, with details=the other values
    when report_fn takes them (module docstring); a hang answer's straggler/hang/* metrics
    the same way, with its step."""

    def __init__(self, report_fn: ReportFn) -> None:
        self._fn = report_fn
        self._details = takes_details(report_fn)

    def write(self, report: Report) -> None:
        self._call(report.metrics, report.step)

    def write_hang(self, event: HangEvent) -> None:
        self._call(event.metrics, event.step)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Nothing to release: report_fn stays the caller's."""

    def _call(self, metrics: Mapping[str, Any], step: int) -> None:
        nums, details = split_metrics(metrics)
        if self._details:
            self._fn(nums, step, details=details)
        else:
            self._fn(nums, step)

    def __repr__(self) -> str:
        return f"CallbackSink({getattr(self._fn, '__qualname__', self._fn)!r})"


def tensorboard(writer: Any) -> ReportFn:
    """report_fn that writes every number of a report with `writer.add_scalar(name, value,
    step)` (a torch.utils.tensorboard SummaryWriter, or anything with that method), e.g.
    ``install(model, optimizer, report_fn=relax_straggler.reporters.tensorboard(writer))``.
    Flushing and closing the writer stay the caller's."""

    def report_fn(metrics: dict[str, Any], step: int) -> None:
        for name, value in metrics.items():
            writer.add_scalar(name, value, step)

    return report_fn


def relax_tracking_report_fn(args: Any, step_key: str = "train/step") -> ReportFn:
    """report_fn that logs through Relax's `tracking_utils.log(args, metrics, step_key)`.

    The step travels inside the dict under step_key, as Relax expects. Raises ImportError
    when Relax is not importable.
    """
    from relax.utils import tracking_utils  # imported lazily: Relax is optional

    def report_fn(metrics: dict[str, Any], step: int) -> None:
        tracking_utils.log(args, {**metrics, step_key: step}, step_key=step_key)

    return report_fn
