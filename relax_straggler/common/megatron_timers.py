"""The Megatron timer vocabulary: every timer name Megatron-Core and Megatron-LM start, and
what its time means in the closed stage set (relax_straggler.common.stages). One table, read in
both directions by the live Timers adapter (integrations/megatron.py), the offline readers
(readers/megatron_names.py, readers/metrics_rows.py), the store sink and the feed.

Timer name -> meaning (`timer_meaning`):

    forward-compute -> forward              backward-compute -> backward
    batch-generator -> data                 optimizer -> optimizer
    optimizer-* (copy-to-main-grad, unscale-and-check-inf, clip-main-grad, count-zeros,
        inner-step, copy-main-to-model-params) -> optimizer, part of `optimizer`: Megatron
        starts them inside optimizer.step(), which training.py times as `optimizer`
    all-grads-sync -> communication: the exposed wait for the data-parallel gradient
        reduction (all-reduce, or reduce-scatter with the distributed optimizer)
    grads-reduce-scatter -> communication/reduce_scatter   params-all-gather -> /allgather
    grads-all-reduce and every *-grads-all-reduce (embedding-, layernorm-,
        non-tensor-parallel-, conditional-embedder-) -> communication/allreduce
    forward-send, backward-send -> communication/send, pipeline p2p column of that name
    forward-recv, backward-recv -> communication/recv, pipeline p2p column of that name
    <a>-send-<b>-recv (a, b in forward, backward) -> communication/recv, p2p column <b>-recv:
        the combined op returns when its receive has completed, so its time is a receive wait
    forward-backward-send-forward-backward-recv -> communication/recv, no p2p column: the
        interleaved schedule's exchange in both directions at once is a receive wait too,
        but of both directions, so it belongs to neither per-direction p2p column
    straggler/<stage> -> that stage: what this package writes for a stage without a
        Megatron timer (attention, moe, communication/broadcast ...)

Known and not a stage (meaning with stage None): forward-backward (the whole schedule, the
parent of the compute and p2p timers), interval-time (the step; read as the step time),
evaluate, eval-time, checkpointing (save-checkpoint, save-checkpoint-non-persistent,
load-checkpoint), setup (model-and-optimizer-setup, train/valid/test-data-iterators-setup),
gpu-sniff-test, gc (host garbage collection, in recorded traces) and the RL loop's rl/*
phases (rollout, inference, weight transfer: outside the training step's stages), and the
live verdict's own rows (straggler/verdict, straggler/verdict/finding). Any other name is
unknown.

Stage -> timer name (`stage_timer_name`), used when writing rows: the one timer that means
that stage alone (forward -> forward-compute, communication -> all-grads-sync, ...), else
straggler/<stage>.

Reading a part-of timer: the live adapter times it (the stage timer merges sections of one
stage nested in each other, and Megatron's `optimizer` timer is on the global Timers, not on
the config's); a reader of recorded timers skips it, as its parent already holds its time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional

from relax_straggler.common.metric_names import (END_METRIC, FINDING_METRIC, HANG_METRIC, PREFIX, VERDICT_METRIC,
                                          stage_row_name)
from relax_straggler.common.stages import STAGE_IDS, stage_id

# The package's own rows (relax_straggler.common.metric_names.STORE_ROWS) that are known and not a stage.
_OUR_ROWS = (VERDICT_METRIC, FINDING_METRIC, HANG_METRIC, END_METRIC)


@dataclass(frozen=True)
class TimerMeaning:
    """What a timer's time is. stage: a STAGES name, None for a known timer that is not a
    stage. p2p: the pipeline p2p column ("forward-send", "forward-recv", "backward-send",
    "backward-recv") or None. part_of: the timer of the same stage whose time already
    includes this one, or None."""

    stage: Optional[str]
    p2p: Optional[str] = None
    part_of: Optional[str] = None


NOT_A_STAGE = TimerMeaning(None)

_OPTIMIZER_PART = TimerMeaning("optimizer", part_of="optimizer")
_RECV = "communication/recv"

# Every name Megatron-Core / Megatron-LM start (megatron/core/pipeline_parallel/schedules.py and
# p2p_communication.py, distributed/finalize_model_grads.py, optimizer/, training/training.py,
# the pretrain_* scripts), and the older names still found in recorded logs and traces.
KNOWN_TIMERS: Mapping[str, TimerMeaning] = {
    "forward-compute": TimerMeaning("forward"),
    "backward-compute": TimerMeaning("backward"),
    "batch-generator": TimerMeaning("data"),
    "optimizer": TimerMeaning("optimizer"),
    "optimizer-copy-to-main-grad": _OPTIMIZER_PART,
    "optimizer-unscale-and-check-inf": _OPTIMIZER_PART,
    "optimizer-clip-main-grad": _OPTIMIZER_PART,
    "optimizer-count-zeros": _OPTIMIZER_PART,
    "optimizer-inner-step": _OPTIMIZER_PART,
    "optimizer-copy-main-to-model-params": _OPTIMIZER_PART,
    "all-grads-sync": TimerMeaning("communication"),
    "grads-reduce-scatter": TimerMeaning("communication/reduce_scatter"),
    "params-all-gather": TimerMeaning("communication/allgather"),
    "grads-all-reduce": TimerMeaning("communication/allreduce"),
    "embedding-grads-all-reduce": TimerMeaning("communication/allreduce"),
    "layernorm-grads-all-reduce": TimerMeaning("communication/allreduce"),
    "non-tensor-parallel-grads-all-reduce": TimerMeaning("communication/allreduce"),
    "conditional-embedder-grads-all-reduce": TimerMeaning("communication/allreduce"),
    "forward-send": TimerMeaning("communication/send", p2p="forward-send"),
    "backward-send": TimerMeaning("communication/send", p2p="backward-send"),
    "forward-recv": TimerMeaning(_RECV, p2p="forward-recv"),
    "backward-recv": TimerMeaning(_RECV, p2p="backward-recv"),
    "forward-send-forward-recv": TimerMeaning(_RECV, p2p="forward-recv"),
    "forward-send-backward-recv": TimerMeaning(_RECV, p2p="backward-recv"),
    "backward-send-forward-recv": TimerMeaning(_RECV, p2p="forward-recv"),
    "backward-send-backward-recv": TimerMeaning(_RECV, p2p="backward-recv"),
    "forward-backward-send-forward-backward-recv": TimerMeaning(_RECV),
    "forward-backward": NOT_A_STAGE,
    "interval-time": NOT_A_STAGE,
    "evaluate": NOT_A_STAGE,
    "eval-time": NOT_A_STAGE,
    "save-checkpoint": NOT_A_STAGE,
    "save-checkpoint-non-persistent": NOT_A_STAGE,
    "load-checkpoint": NOT_A_STAGE,
    "model-and-optimizer-setup": NOT_A_STAGE,
    "train/valid/test-data-iterators-setup": NOT_A_STAGE,
    "gpu-sniff-test": NOT_A_STAGE,
    "gc": NOT_A_STAGE,
}

# Families beyond the listed names: a future optimizer sub-step or gradient all-reduce keeps
# its family's meaning.
_FAMILIES: tuple[tuple[re.Pattern, TimerMeaning], ...] = (
    (re.compile(r"-grads-all-reduce$"), TimerMeaning("communication/allreduce")),
    (re.compile(r"^optimizer-"), _OPTIMIZER_PART),
    (re.compile(r"^rl/"), NOT_A_STAGE),
)

# The timer written for each stage that one Megatron timer means alone.
TIMER_OF_STAGE: Mapping[str, str] = {
    "forward": "forward-compute",
    "backward": "backward-compute",
    "optimizer": "optimizer",
    "data": "batch-generator",
    "communication": "all-grads-sync",
    "communication/allreduce": "grads-all-reduce",
    "communication/reduce_scatter": "grads-reduce-scatter",
    "communication/allgather": "params-all-gather",
}


def timer_meaning(name: str) -> Optional[TimerMeaning]:
    """The meaning of timer `name` (a Megatron timer or straggler/<stage>); None when the
    name is unknown."""
    meaning = KNOWN_TIMERS.get(name)
    if meaning is not None:
        return meaning
    if name in _OUR_ROWS:
        return NOT_A_STAGE
    if name.startswith(PREFIX) and name[len(PREFIX):] in STAGE_IDS:
        return TimerMeaning(name[len(PREFIX):])
    for pattern, family in _FAMILIES:
        if pattern.search(name):
            return family
    return None


def live_stage(name: str) -> Optional[str]:
    """The stage a live timer section of `name` opens, part-of timers included; None when
    the name is not a stage or unknown."""
    meaning = timer_meaning(name)
    return meaning.stage if meaning is not None else None


def stage_timer_name(stage: str) -> str:
    """The timer name `stage` is written under: TIMER_OF_STAGE, else straggler/<stage>.
    Raises ValueError for a name outside STAGES."""
    stage_id(stage)
    return TIMER_OF_STAGE.get(stage, stage_row_name(stage))
