"""Instrumentation compared in benchmarks/overhead.py: a common probe interface and the
peers' implementations of it (a Megatron-style synchronizing timer, NVIDIA Resiliency
Ext's straggler Detector). relax_straggler's own probe lives in overhead.py.

Every probe is driven by the same training step:

    with probe.section("data"):      batch = next(loader)
    probe.workload(tokens)
    with probe.section("forward"):   loss = loss_fn(model(x), y)
    with probe.section("backward"):  loss.backward()
    with probe.section("optimizer"): optimizer.step(); optimizer.zero_grad()
    probe.end_step()

so each variant pays the same harness code and differs only by what the tool does.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Protocol

STAGES = ("data", "forward", "backward", "optimizer")

NULL_SECTION: ContextManager[None] = contextlib.nullcontext()


class Probe(Protocol):
    """One instrumentation variant. Counters (`counters()`) are totals since creation."""

    def section(self, stage: str) -> ContextManager[Any]:
        """Context timing `stage` (one of STAGES)."""

    def workload(self, tokens: int) -> None:
        """This rank's work in the current step."""

    def end_step(self) -> None:
        """Called once after each step."""

    def counters(self) -> dict[str, int]:
        """Device synchronizations, gathers, reports... done so far (names are the probe's)."""

    def close(self) -> None:
        """Removes the instrumentation (collective when distributed)."""


class BareProbe:
    """No instrumentation at all: the baseline every ratio divides by."""

    def section(self, stage: str) -> ContextManager[None]:
        return NULL_SECTION

    def workload(self, tokens: int) -> None:
        pass

    def end_step(self) -> None:
        pass

    def counters(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass
