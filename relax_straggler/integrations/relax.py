"""Relax integration: the flags in Relax's argument chain and the analysis of its
Megatron backend (patches/relax/ calls `add_arguments`, `train_step` and `add_workload`).

Relax calls ``train(...)`` once per rollout in each training process (actor or
critic). `attach()` installs the analysis on the first call (collective, like every
install) and returns the same object afterwards, so the step counter, sampling and the
side group live for the whole run. Reports go to Relax's
``tracking_utils.log(args, metrics, step_key="train/step")`` on the metrics rank, off
the training thread, with Relax's own step number.

Relax's own profiler (relax/utils/straggler/, ``RELAX_STRAGGLER_PROFILER`` or
``RELAX_STRAGGLER_ENABLE``) may run in the same process: it puts its timers object in
``config.timers``; inside a training step ours is chained in front of it (each Megatron
timer call reaches both once), and the two publish disjoint metric names
(docs/INTEGRATIONS.md, "Relax's own straggler profiler").
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any, ContextManager, Optional, Sequence, Union

import torch

from relax_straggler.config import StragglerConfig, add_arguments as add_straggler_arguments, from_args
from relax_straggler.integrations.megatron import MegatronAnalysis, NullMegatronAnalysis, install
from relax_straggler.reporters.callback import relax_tracking_report_fn

log = logging.getLogger(__name__)

_ATTACHED: Optional[Union[MegatronAnalysis, NullMegatronAnalysis]] = None
_ATTACHED_MODELS: tuple[int, ...] = ()

# The switches of Relax's own profiler (relax/utils/straggler/config.py), by Relax version.
RELAX_PROFILER_SWITCHES = ("RELAX_STRAGGLER_PROFILER", "RELAX_STRAGGLER_ENABLE")
_FALSE = ("", "0", "false", "f", "no", "n", "off")


def relax_profiler_enabled() -> bool:
    """Whether Relax's own straggler profiler is switched on in this process's environment."""
    return any(os.environ.get(name, "").strip().lower() not in _FALSE for name in RELAX_PROFILER_SWITCHES)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the ``--straggler-*`` flags; returns the parser (Relax's add_*_arguments
    convention)."""
    add_straggler_arguments(parser)
    return parser


def config_from_args(args: argparse.Namespace) -> StragglerConfig:
    """The config from Relax's args; disabled when the flags were never added (a Relax
    without the patched argument chain). Raises ValueError on bad values."""
    if not hasattr(args, "straggler_analysis"):
        return StragglerConfig(enabled=False)
    return from_args(args)


def attach(args: argparse.Namespace, model: Sequence[torch.nn.Module], optimizer: Any) -> Union[MegatronAnalysis,
                                                                                              NullMegatronAnalysis]:
    """The analysis of this process's training loop, installed on the first call.

    args: Relax's parsed args (``--straggler-*`` included by add_arguments). model: the
    DDP-wrapped model chunks; optimizer: the Megatron optimizer. Disabled (the default)
    returns a NullMegatronAnalysis and changes nothing. The first call is collective
    over the process's default group: Relax's train() runs on every rank of the role.
    Raises RuntimeError when called again with other model chunks (one analysis per
    process), ValueError for bad flag values.
    """
    global _ATTACHED, _ATTACHED_MODELS
    models = tuple(id(m) for m in model)
    if _ATTACHED is not None:
        if models != _ATTACHED_MODELS:
            raise RuntimeError("relax_straggler: attach() was already called in this process for other model "
                               "chunks; one training loop per process is analyzed")
        return _ATTACHED
    config = config_from_args(args)
    report_fn = relax_tracking_report_fn(args) if config.enabled else None
    if config.enabled and relax_profiler_enabled():
        log.info("relax_straggler: Relax's own straggler profiler is on too; inside training steps ours chains "
                 "to its config.timers, and the two publish different metric names")
    _ATTACHED = install(list(model), optimizer, config=config, report_fn=report_fn)
    _ATTACHED_MODELS = models
    return _ATTACHED


def train_step(args: argparse.Namespace, model: Sequence[torch.nn.Module], optimizer: Any,
               step: int) -> ContextManager[Any]:
    """The scope of one training step of Relax's Megatron backend (what the patched train()
    enters around train_one_step()): attaches the analysis on the first call (collective,
    see attach()) and returns its train_step(step=step). step: Relax's step,
    ``rollout_id * num_steps_per_rollout + step_id``. Raises as attach()."""
    return attach(args, model, optimizer).train_step(step=step)


def add_workload(tokens: float) -> None:
    """Adds one microbatch's tokens to this process's training step (Relax's forward
    step calls it), so ranks with unequal dynamic batches are compared per token. A no-op
    when nothing is attached or outside a training step. Raises ValueError for a
    negative or non-finite count."""
    if _ATTACHED is not None:
        _ATTACHED.add_workload(tokens)


def detach() -> None:
    """Uninstalls the attached analysis (collective), e.g. at the end of training."""
    global _ATTACHED, _ATTACHED_MODELS
    if _ATTACHED is not None:
        _ATTACHED.uninstall()
    _ATTACHED, _ATTACHED_MODELS = None, ()
