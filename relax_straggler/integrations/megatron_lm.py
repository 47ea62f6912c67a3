"""Megatron-LM integration: what patches/megatron-lm/ calls from megatron/training.

Three calls, each one guarded line of the patch (the logic and the release checks live
here, so the patch stays the same across Megatron-LM releases):

- `add_arguments(parser)` (arguments.py, beside the straggler-detector flags): the
  ``--straggler-*`` flags.
- `train_started(args, model, optimizer, config)` (train(), after its setup, every rank):
  installs the analysis and rebinds ``megatron.training.training.train_step`` so every
  training step runs inside the analysis' step scope, numbered as Megatron-LM logs it
  (``iteration + 1``: the steps done once it ends). Inside it the model config's, the
  optimizer configs' and Megatron-LM's global timers (``get_timers()``) are chained adapters,
  so ``batch-generator`` of ``pretrain_gpt.forward_step`` is the ``data`` stage and the
  ``optimizer`` timer of ``train_step`` the ``optimizer`` stage.
- `train_ended()` (train(), after its loop, before the ``sys.exit()`` of --exit-interval,
  --exit-duration-in-mins and the exit signal handler, and before the normal return): puts
  ``train_step`` back and uninstalls the analysis, which flushes its last reports.

The private parts of Megatron-LM this uses are checked in relax_straggler.integrations.megatron_compat.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from relax_straggler.config import add_arguments as add_straggler_arguments, from_args
from relax_straggler.integrations import megatron_compat
from relax_straggler.integrations.megatron import MegatronAnalysis, install

log = logging.getLogger(__name__)


@dataclass
class _Run:
    analysis: MegatronAnalysis
    step_slot: megatron_compat.Slot
    train_step: Callable[..., Any]  # the one that was there


_RUN: Optional[_Run] = None


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the ``--straggler-*`` flags; returns the parser (Megatron-LM's _add_*_args convention)."""
    add_straggler_arguments(parser)
    return parser


def _scoped(train_step: Callable[..., Any], analysis: MegatronAnalysis) -> Callable[..., Any]:
    """train_step run inside analysis.train_step(step=iteration + 1): the step numbered as
    Megatron-LM logs it (train() counts a step done before training_log() names it; checked
    by megatron_compat.check_train_loop)."""
    names = list(inspect.signature(train_step).parameters)
    position = names.index("iteration") if "iteration" in names else None

    @functools.wraps(train_step)
    def scoped(*args: Any, **kwargs: Any) -> Any:
        iteration = kwargs.get("iteration")
        if iteration is None and position is not None and position < len(args):
            iteration = args[position]
        with analysis.train_step(step=None if iteration is None else iteration + 1):
            return train_step(*args, **kwargs)

    return scoped


def train_started(args: argparse.Namespace, model: Sequence[torch.nn.Module], optimizer: Any, config: Any) -> None:
    """Attaches the analysis to this train() (--straggler-analysis given). Collective: every
    rank calls it at the same point. args: Megatron-LM's parsed args; model: the model chunks;
    optimizer: the Megatron optimizer; config: the model config train() set up
    (``config.timers`` is Megatron's global Timers).

    A train() left by an exception (in-process restart) is ended first. Raises RuntimeError
    when this Megatron-LM breaks an assumption of megatron_compat (the message names it; a
    patch hook out of place included), ValueError for bad flag values."""
    global _RUN
    if _RUN is not None:
        log.warning("relax_straggler: train() entered again without leaving the last one; ending that analysis")
        train_ended()
    megatron_compat.release()
    step_slot = megatron_compat.train_step_slot()
    megatron_compat.check_running_train()
    timers_slot = megatron_compat.global_timers_slot()
    analysis = install(list(model), optimizer, config=from_args(args), model_config=config,
                       timer_slots=[(timers_slot.owner, timers_slot.name)])
    if not isinstance(analysis, MegatronAnalysis):  # --straggler-analysis off after all: nothing to attach
        return
    original = step_slot.get()
    step_slot.set(_scoped(original, analysis))
    _RUN = _Run(analysis, step_slot, original)


def train_ended() -> None:
    """Puts train_step back and uninstalls the analysis (collective: every rank), which
    flushes its pending reports. Does nothing when nothing is attached."""
    global _RUN
    run, _RUN = _RUN, None
    if run is None:
        return
    run.step_slot.set(run.train_step)
    run.analysis.uninstall()


def active() -> Optional[MegatronAnalysis]:
    """The analysis attached to the running train(), or None."""
    return _RUN.analysis if _RUN is not None else None
