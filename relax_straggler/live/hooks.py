"""Module, autograd and optimizer hooks that open and close stage sections.

forward:       forward pre/post hooks on each model chunk.
backward:      starts when the gradient of a model output is computed (a tensor hook
               armed by the forward post-hook, sampled steps only) and ends in an
               autograd-engine final callback queued at that moment. The callback runs
               when the backward pass has computed every gradient, before DDP's own
               final callback (queued later) waits for the gradient all-reduce: the
               backward stage is compute only (docs/ARCHITECTURE.md invariant 8).
communication: under DDP, a second final callback, queued from the first, runs after
               DDP's: the time between the two is the exposed wait for gradient sync.
optimizer:     optimizer step pre/post hooks; the post hook ends the step.

A full module backward hook is not used: on a model fed integer token ids it fires at
the start of the module's backward, not the end (a known pitfall of such hooks). Forwards re-run
inside backward by activation recomputation are not counted as forward.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, Callable, Iterator, Optional

import torch
from torch.autograd import Variable

from relax_straggler.common.stages import stage_id

log = logging.getLogger(__name__)

FORWARD, BACKWARD, OPTIMIZER, COMMUNICATION = (stage_id(s) for s in ("forward", "backward", "optimizer", "communication"))


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def grad_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """The tensors that require grad inside a module's inputs or outputs: obj itself, or
    nested in tuples, lists, dict values and dataclass fields, in that order."""
    if isinstance(obj, torch.Tensor):
        if obj.requires_grad:
            yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from grad_tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from grad_tensors(x)
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            yield from grad_tensors(getattr(obj, name))


def guarded(what: str) -> Callable:
    """A hook that raises is logged once and otherwise ignored: observing never stops training."""

    def wrap(fn: Callable) -> Callable:
        failed = False

        @functools.wraps(fn)
        def hook(*args: Any, **kwargs: Any) -> None:
            nonlocal failed
            try:
                fn(*args, **kwargs)
            except Exception:
                if not failed:
                    failed = True
                    log.warning("relax_straggler: %s hook failed; training continues (shown once)", what,
                                exc_info=True)

        return hook

    return wrap


class TrainingHooks:
    """Registers the hooks on models and optimizer; remove() takes every one away.

    timer: a StageTimer; on_step_end(): called by the optimizer post-hook after the
    optimizer section closed. time_grad_sync: time the post-backward gradient-sync wait
    as `communication` (set when a model is DistributedDataParallel).
    """

    def __init__(self, timer: Any, models: list[torch.nn.Module], optimizer: Optional[torch.optim.Optimizer],
                 on_step_end: Callable[[], None], time_grad_sync: bool) -> None:
        self._timer = timer
        self._on_step_end = on_step_end
        self._time_grad_sync = time_grad_sync
        self._backward_open = False
        self._forward_passes = 0
        self._counting = bool(models)
        self.handles: list[Any] = []
        for model in models:
            self.handles.append(model.register_forward_pre_hook(self._forward_pre))
            self.handles.append(model.register_forward_hook(self._forward_post))
        if optimizer is not None:
            self.handles.append(optimizer.register_step_pre_hook(self._optimizer_pre))
            self.handles.append(optimizer.register_step_post_hook(self._optimizer_post))

    @property
    def forward_passes(self) -> float:
        """Training forward passes (grad enabled) of the models so far, every step counted;
        NaN without a model to count them on."""
        return float(self._forward_passes) if self._counting else math.nan

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    # forward ---------------------------------------------------------------------------
    @guarded("forward pre")
    def _forward_pre(self, module: torch.nn.Module, inputs: Any) -> None:
        # Every step, not only sampled ones: the count checks that the ranks' steps line up.
        self._forward_passes += torch.is_grad_enabled()
        if self._timer.sampled and not _in_backward():
            self._timer.start(FORWARD)

    @guarded("forward post")
    def _forward_post(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if not self._timer.sampled or _in_backward():
            return
        self._timer.stop(FORWARD)
        if torch.is_grad_enabled():
            for t in grad_tensors(output):
                t.register_hook(self._on_output_grad)

    # backward --------------------------------------------------------------------------
    def _on_output_grad(self, grad: torch.Tensor) -> None:
        self._backward_started()  # returns None: the gradient is left untouched

    @guarded("backward start")
    def _backward_started(self) -> None:
        if self._backward_open:  # another output of the same backward pass
            return
        self._backward_open = True
        self._timer.start(BACKWARD)
        Variable._execution_engine.queue_callback(self._backward_ended)

    @guarded("backward end")
    def _backward_ended(self) -> None:
        self._backward_open = False
        self._timer.stop(BACKWARD)
        if self._time_grad_sync:
            self._timer.start(COMMUNICATION)
            Variable._execution_engine.queue_callback(self._grad_sync_ended)

    @guarded("gradient sync end")
    def _grad_sync_ended(self) -> None:
        self._timer.stop(COMMUNICATION)

    # optimizer -------------------------------------------------------------------------
    @guarded("optimizer pre")
    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._timer.start(OPTIMIZER)

    @guarded("optimizer post")
    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._timer.stop(OPTIMIZER)
        self._on_step_end()
