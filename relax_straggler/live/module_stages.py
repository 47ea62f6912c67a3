"""Optional `attention` and `moe` stages (--straggler-enable-module-stages).

Modules whose class name matches a stage's pattern are timed into that stage, forward
and backward, on sampled steps:

forward:   the module's forward pre-hook to its forward post-hook.
backward:  from the moment the gradient of one of the module's outputs is computed
           (a tensor hook armed by the forward post-hook) to the moment the gradient
           of its first grad-requiring input is computed (a tensor hook armed by the
           forward pre-hook). A module call whose inputs need no grad (fed integer ids)
           has no such end, so its backward is not timed rather than timed wrong.

Each module call therefore adds at most two sections (one forward, one backward) to
its stage, whatever the activation recomputation:

- Forwards re-run inside backward (``_in_backward()``) never open a forward section.
- Reentrant checkpointing (``torch.utils.checkpoint(use_reentrant=True)``, Megatron's
  ``tensor_parallel.checkpoint``) runs the first forward without grad and the real
  backward through the recomputed graph: the hooks armed during the recompute time it.
- Non-reentrant checkpointing keeps the first forward's graph: the hooks armed there
  time the backward, and those armed during the recompute never fire (the recomputed
  outputs receive no gradient), so nothing is counted twice.

Nested matches (an attention core inside an attention block) are timed once by the
stage timer's outermost-section rule, forward and backward alike.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable, Iterable, Mapping, Optional

import torch

from relax_straggler.common.stages import MODULE_STAGES, stage_id
from relax_straggler.config import StragglerConfig
from relax_straggler.live.hooks import _in_backward, grad_tensors, guarded

log = logging.getLogger(__name__)

# Matched with re.search against type(module).__name__. Covers Megatron-Core
# (SelfAttention, CrossAttention, MLASelfAttention, DotProductAttention, MoELayer),
# Hugging Face (LlamaAttention, Qwen2Attention, MixtralSparseMoeBlock,
# Qwen2MoeSparseMoeBlock, DeepseekV3MoE, ...) and torch (MultiheadAttention).
DEFAULT_PATTERNS: dict[str, str] = StragglerConfig().module_patterns()


def compile_patterns(patterns: Mapping[str, str]) -> dict[str, re.Pattern]:
    """{stage: regex} -> {stage: compiled}. Raises ValueError for a stage outside
    MODULE_STAGES or a regex that does not compile."""
    compiled = {}
    for stage, pattern in patterns.items():
        if stage not in MODULE_STAGES:
            raise ValueError(f"module stage {stage!r} is not one of {', '.join(MODULE_STAGES)}")
        try:
            compiled[stage] = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"module stage {stage!r}: bad class-name pattern {pattern!r}: {exc}") from None
    return compiled


class _Call:
    """Backward state of one module call: opened by the first output gradient, closed
    by the first input gradient."""

    __slots__ = ("opened", "closed")

    def __init__(self) -> None:
        self.opened = False
        self.closed = False


class ModuleStageHooks:
    """Times matched modules' forward and backward into their stages; remove() undoes it.

    timer: the analyzer's StageTimer. models: the modules to search (every submodule's
    class name is matched; the first matching stage wins). patterns: {stage: regex} for
    stages in MODULE_STAGES, default DEFAULT_PATTERNS. gate: when given, a module call
    is timed only if gate() is true at its forward (e.g. only inside a training step,
    not in evaluation forwards). Raises ValueError for bad patterns.
    Attributes: matched {stage: number of modules hooked}, untimed_backward (module
    calls whose inputs needed no grad, so their backward had no end to time).
    """

    def __init__(self, timer: Any, models: Iterable[torch.nn.Module],
                 patterns: Optional[Mapping[str, str]] = None,
                 gate: Optional[Callable[[], bool]] = None) -> None:
        self._timer = timer
        self._gate = gate
        self.handles: list[Any] = []
        self.matched: dict[str, int] = {}
        self.untimed_backward = 0
        compiled = compile_patterns(DEFAULT_PATTERNS if patterns is None else patterns)
        seen: set[int] = set()
        for model in models:
            for module in model.modules():
                if id(module) in seen:  # shared between chunks: hook once
                    continue
                seen.add(id(module))
                name = type(module).__name__
                for stage, pattern in compiled.items():
                    if pattern.search(name):
                        self._hook(module, stage_id(stage))
                        self.matched[stage] = self.matched.get(stage, 0) + 1
                        break
        for stage in compiled:
            if stage not in self.matched:
                log.info("relax_straggler: no module class matches %r for the %s stage; it will not be reported",
                            compiled[stage].pattern, stage)

    def _hook(self, module: torch.nn.Module, sid: int) -> None:
        timer = self._timer
        gate = self._gate
        calls: list[_Call] = []  # calls whose forward is running (a stack: modules may recurse)

        def backward_started(call: _Call) -> Callable[[torch.Tensor], None]:
            def hook(grad: torch.Tensor) -> None:
                if not call.opened:
                    call.opened = True
                    timer.start(sid)
            return hook

        def backward_ended(call: _Call) -> Callable[[torch.Tensor], None]:
            def hook(grad: torch.Tensor) -> None:
                if call.opened and not call.closed:
                    call.closed = True
                    timer.stop(sid)
            return hook

        @guarded("module stage pre")
        def pre(mod: torch.nn.Module, inputs: Any) -> None:
            if not timer.sampled or (gate is not None and not gate()):
                return
            call = _Call()
            if torch.is_grad_enabled():
                ins = list(grad_tensors(inputs))
                if ins:
                    ins[0].register_hook(backward_ended(call))
                else:
                    call.closed = True  # nothing marks the end of this call's backward
            else:
                call.closed = True
            calls.append(call)
            if not _in_backward():
                timer.start(sid)

        @guarded("module stage post")
        def post(mod: torch.nn.Module, inputs: Any, output: Any) -> None:
            if not calls:  # the pre-hook did not run for this call (not sampled, gated)
                return
            call = calls.pop()
            if not _in_backward():
                timer.stop(sid)
            if call.closed:
                if torch.is_grad_enabled() and not _in_backward() and any(True for _ in grad_tensors(output)):
                    self.untimed_backward += 1
                return
            started = backward_started(call)
            for t in grad_tensors(output):
                t.register_hook(started)

        self.handles.append(module.register_forward_pre_hook(pre))
        self.handles.append(module.register_forward_hook(post))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
