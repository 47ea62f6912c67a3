"""Optional `attention` and `moe` stages (--straggler-enable-module-stages).

Modules whose class name matches a pattern get forward pre/post hooks that time their
forward into the stage. Forwards re-run by activation recomputation inside backward
are skipped, so they are not counted twice. Nested matches (an attention block inside
another) are timed once by the timer's outermost-section rule.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

import torch

from relax_straggler.hooks import _in_backward, guarded
from relax_straggler.stages import stage_id

# Megatron-Core (SelfAttention, CrossAttention, MoELayer), Hugging Face (LlamaAttention,
# MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock, ...) and torch (MultiheadAttention).
DEFAULT_PATTERNS: dict[str, str] = {
    "attention": r"(Attention|Attn)$",
    "moe": r"(MoELayer|MoE|SparseMoeBlock|SparseMoE|Experts)$",
}


class ModuleStageHooks:
    """Times matched modules' forward into their stages; remove() undoes it."""

    def __init__(self, timer: Any, models: Iterable[torch.nn.Module],
                 patterns: dict[str, str] | None = None) -> None:
        self._timer = timer
        self.handles: list[Any] = []
        self.matched: dict[str, int] = {}
        compiled = {stage: re.compile(p) for stage, p in (patterns or DEFAULT_PATTERNS).items()}
        for model in models:
            for module in model.modules():
                name = type(module).__name__
                for stage, pattern in compiled.items():
                    if pattern.search(name):
                        self._hook(module, stage_id(stage))
                        self.matched[stage] = self.matched.get(stage, 0) + 1
                        break

    def _hook(self, module: torch.nn.Module, sid: int) -> None:
        timer = self._timer

        @guarded("module stage pre")
        def pre(mod: torch.nn.Module, inputs: Any) -> None:
            if timer.sampled and not _in_backward():
                timer.start(sid)

        @guarded("module stage post")
        def post(mod: torch.nn.Module, inputs: Any, output: Any) -> None:
            if timer.sampled and not _in_backward():
                timer.stop(sid)

        self.handles.append(module.register_forward_pre_hook(pre))
        self.handles.append(module.register_forward_hook(post))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
