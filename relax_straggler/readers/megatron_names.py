"""Megatron timer names onto the closed stage set (ARCHITECTURE.md, data contract).

    forward-compute -> forward          backward-compute -> backward
    optimizer -> optimizer              batch-generator -> data
    grads-reduce-scatter -> communication/reduce_scatter
    params-all-gather -> communication/allgather
    grads-all-reduce, *-grads-all-reduce -> communication/allreduce
    all-grads-sync -> communication (Megatron's data-parallel gradient sync, all-reduce or
        reduce-scatter; the same meaning relax_straggler.integrations.megatron gives it)
    forward-send, backward-send -> communication/send   (and the p2p column of that name)
    forward-recv, backward-recv -> communication/recv   (and the p2p column of that name)
    <a>-send-<b>-recv -> communication/recv and the p2p column <b>-recv: the combined
        op returns when its receive completes, so its time is a receive wait.

Stages without a Megatron timer are written by relax_straggler.monitor.sink as
``straggler/<stage>`` (for example straggler/attention) and read back onto that stage;
stage_timer_name gives the name a stage is written under.

Timers whose time is already counted by another timer (parents such as forward-backward and
interval-time; the optimizer's sub-steps optimizer-*, nested inside optimizer) and host-side
events that are not stages (gc, checkpointing, setup) are known and excluded: counted in
the output, never added twice. Any other name is unknown and reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from relax_straggler.readers.base import P2P_OPS
from relax_straggler.stages import STAGE_IDS, stage_id

_DIRECT = {
    "forward-compute": "forward",
    "backward-compute": "backward",
    "optimizer": "optimizer",
    "batch-generator": "data",
    "grads-reduce-scatter": "communication/reduce_scatter",
    "params-all-gather": "communication/allgather",
    "grads-all-reduce": "communication/allreduce",
    "all-grads-sync": "communication",
}
_EXCLUDED = frozenset({
    "forward-backward", "interval-time", "gc", "save-checkpoint", "load-checkpoint",
    "model-and-optimizer-setup", "train/valid/test-data-iterators-setup", "forward-backward-send-forward-backward-recv",
})
_STAGE_TIMER = {stage: name for name, stage in _DIRECT.items()}
_OUR_PREFIX = "straggler/"
_COMBINED = re.compile(r"^(forward|backward)-send-(forward|backward)-recv$")


@dataclass(frozen=True)
class TimerTarget:
    """Where a timer's time goes: a STAGES column and optionally a P2P_OPS column.
    stage None means known and excluded."""

    stage: Optional[int]
    p2p: Optional[int] = None


EXCLUDED = TimerTarget(None)


def timer_target(name: str) -> Optional[TimerTarget]:
    """The target of a Megatron timer name; None when the name is unknown."""
    if name in _DIRECT:
        return TimerTarget(STAGE_IDS[_DIRECT[name]])
    if name in P2P_OPS:
        op = name.rsplit("-", 1)[1]
        return TimerTarget(STAGE_IDS[f"communication/{op}"], P2P_OPS.index(name))
    combined = _COMBINED.match(name)
    if combined:
        return TimerTarget(STAGE_IDS["communication/recv"], P2P_OPS.index(f"{combined.group(2)}-recv"))
    if name.endswith("-grads-all-reduce"):
        return TimerTarget(STAGE_IDS["communication/allreduce"])
    if name in _EXCLUDED or name.startswith("optimizer-"):
        return EXCLUDED
    if name.startswith(_OUR_PREFIX) and name[len(_OUR_PREFIX):] in STAGE_IDS:
        return TimerTarget(STAGE_IDS[name[len(_OUR_PREFIX):]])
    return None


def stage_timer_name(stage: str) -> str:
    """The timer name `stage` is written under: its Megatron timer when one maps onto it
    alone (forward -> forward-compute), else straggler/<stage>. Raises ValueError for a
    name outside STAGES."""
    stage_id(stage)
    return _STAGE_TIMER.get(stage, _OUR_PREFIX + stage)
