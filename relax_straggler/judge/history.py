"""The config each sampled step is judged with, as runtime control changes it."""

from __future__ import annotations

from typing import Any, Mapping

from relax_straggler.config import StragglerConfig


class ConfigHistory:
    """Configs by the first step they apply to, oldest first: a change applies from its
    step on, and reports of earlier steps (still queued) keep the config they were sampled
    under. Changes come from the training thread and reads from the report thread: a
    list append and a scan of it need no lock under the interpreter lock."""

    def __init__(self, config: StragglerConfig) -> None:
        self._configs: list[tuple[int, StragglerConfig]] = [(0, config)]

    def change(self, from_step: int, changes: Mapping[str, Any]) -> None:
        """From step `from_step` (the analyzer's count) on, the latest config with `changes`
        (StragglerConfig field -> value). Raises ValueError for an invalid value."""
        self._configs.append((from_step, self._configs[-1][1].replace(**changes)))

    def at(self, step: int) -> StragglerConfig:
        """The config of step `step` (the analyzer's count)."""
        return next(c for first, c in reversed(self._configs) if first <= step)
