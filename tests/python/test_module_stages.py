"""Module stages (--straggler-enable-module-stages): attention / MoE modules timed forward
and backward, once per call whatever the activation recomputation, and a rank slowed
in attention named in `attention` across real ranks."""

import dataclasses
import json
import math
from typing import Optional

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from relax_straggler import StragglerConfig
from relax_straggler._ext import ext
from relax_straggler.common.stages import STAGES, stage_id
from relax_straggler.live.module_stages import DEFAULT_PATTERNS, ModuleStageHooks, compile_patterns
import relax_straggler

from conftest import DETECTION, REAL_RUNS, REPO, torchrun
from workers.slow_backward import SlowBackward
from workers.step_times import assert_not_blocked

pytestmark = [REAL_RUNS, DETECTION]

C = ext()
ATTN, MOE = stage_id("attention"), stage_id("moe")


class SelfAttention(nn.Module):
    def __init__(self, d: int, backward_s: float = 0.0) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.backward_s = backward_s

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        y = self.out(F.scaled_dot_product_attention(q, k, v))
        return SlowBackward.apply(y, self.backward_s) if self.backward_s else y


class MoELayer(nn.Module):
    def __init__(self, d: int, experts: int = 2) -> None:
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(experts))

    def forward(self, x):
        weights = self.router(x).softmax(-1)
        return sum(weights[..., i:i + 1] * e(x) for i, e in enumerate(self.experts))


class Block(nn.Module):
    def __init__(self, d: int, recompute: str, backward_s: float = 0.0) -> None:
        super().__init__()
        self.attn, self.moe = SelfAttention(d, backward_s), MoELayer(d)
        self.recompute = recompute

    def _body(self, x):
        x = x + self.attn(x)
        return x + self.moe(x)

    def forward(self, x):
        if self.recompute == "none":
            return self._body(x)
        return checkpoint(self._body, x, use_reentrant=self.recompute == "reentrant")


class Net(nn.Module):
    def __init__(self, layers: int = 2, d: int = 16, recompute: str = "none", backward_s: float = 0.0) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, d)
        self.blocks = nn.ModuleList(Block(d, recompute, backward_s) for _ in range(layers))
        self.head = nn.Linear(d, 32)

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def one_step(net: nn.Module, timer, hooks: ModuleStageHooks, backward: bool = True, step: int = 0):
    torch.manual_seed(step)
    timer.begin_step(step)
    idx = torch.randint(0, 32, (2, 8))
    out = net(idx)
    if backward:
        F.cross_entropy(out.view(-1, 32), idx.view(-1)).backward()
    return timer.end_step()


def timer_and_hooks(net: nn.Module, **kw):
    timer = C.StageTimer(len(STAGES), interval=1)
    return timer, ModuleStageHooks(timer, [net], **kw)


@pytest.mark.parametrize("recompute", ["none", "reentrant", "non_reentrant"])
def test_one_forward_and_one_backward_section_per_call_whatever_the_recompute(recompute):
    net = Net(layers=2, recompute=recompute)
    timer, hooks = timer_and_hooks(net)
    assert hooks.matched == {"attention": 2, "moe": 2}
    for step in range(3):
        s = one_step(net, timer, hooks, step=step)
        # 2 attention + 2 MoE modules, each one forward and one backward section.
        assert s.calls[ATTN] == 4 and s.calls[MOE] == 4, (recompute, s.calls[ATTN], s.calls[MOE])
        assert s.device_ms[ATTN] > 0 and s.device_ms[MOE] > 0
    assert timer.unmatched_stops == 0 and timer.open_at_step_end == 0
    assert hooks.untimed_backward == 0


@pytest.mark.parametrize("recompute", ["none", "reentrant", "non_reentrant"])
def test_backward_time_is_in_the_stage(recompute):
    net = Net(layers=1, recompute=recompute, backward_s=0.1)
    timer, hooks = timer_and_hooks(net)
    s = one_step(net, timer, hooks)
    assert s.host_ms[ATTN] >= 100.0 * 0.95  # the sleep in attention's backward
    assert s.host_ms[MOE] < 100.0 * 0.9  # MoE's backward ends before attention's starts


def test_forward_only_times_forward_only():
    net = Net(layers=2)
    timer, _ = timer_and_hooks(net)
    timer.begin_step(0)
    with torch.no_grad():
        net(torch.randint(0, 32, (2, 8)))
    s = timer.end_step()
    assert s.calls[ATTN] == 2 and s.calls[MOE] == 2
    assert timer.open_at_step_end == 0


def test_nested_matches_are_timed_once():
    class Outer(nn.Module):  # an "...Attention" holding another one
        def __init__(self):
            super().__init__()
            self.core = SelfAttention(16)

        def forward(self, x):
            return self.core(x) * 2

    Outer.__name__ = "BlockAttention"
    net = nn.Sequential(nn.Linear(16, 16), Outer())
    timer, hooks = timer_and_hooks(net)
    timer.begin_step(0)
    net(torch.randn(2, 16)).sum().backward()
    s = timer.end_step()
    assert hooks.matched == {"attention": 2}
    assert s.calls[ATTN] == 2  # one forward, one backward: the inner ones are nested
    assert timer.open_at_step_end == 0 and timer.unmatched_stops == 0


def test_a_module_returning_a_dataclass_has_its_backward_timed():
    @dataclasses.dataclass
    class AttentionOutput:
        hidden: torch.Tensor
        weights: Optional[torch.Tensor] = None

    class DataclassAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 16)

        def forward(self, x):
            return AttentionOutput(self.proj(x).relu())

    net = nn.Sequential(nn.Linear(16, 16), DataclassAttention())
    timer, hooks = timer_and_hooks(net)
    timer.begin_step(0)
    net(torch.randn(2, 16)).hidden.sum().backward()
    s = timer.end_step()
    assert s.calls[ATTN] == 2  # one forward, one backward
    assert hooks.untimed_backward == 0
    assert timer.open_at_step_end == 0 and timer.unmatched_stops == 0


def test_a_call_whose_inputs_need_no_grad_has_no_backward_section():
    class TokenAttention(nn.Module):  # fed integer ids: nothing marks its backward's end
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(8, 4)

        def forward(self, idx):
            return self.emb(idx)

    net = TokenAttention()
    timer, hooks = timer_and_hooks(net)
    timer.begin_step(0)
    net(torch.randint(0, 8, (3,))).sum().backward()
    s = timer.end_step()
    assert s.calls[ATTN] == 1 and hooks.untimed_backward == 1
    assert timer.open_at_step_end == 0


def test_gate_and_sampling_keep_hooks_quiet():
    net = Net(layers=1)
    open_gate = [False]
    timer = C.StageTimer(len(STAGES), interval=2)
    hooks = ModuleStageHooks(timer, [net], gate=lambda: open_gate[0])
    assert one_step(net, timer, hooks, step=0).calls[ATTN] == 0  # gate closed
    open_gate[0] = True
    assert not one_step(net, timer, hooks, step=1).sampled
    assert timer.events_recorded == 0  # nothing recorded on the gated and the unsampled step
    assert one_step(net, timer, hooks, step=2).calls[ATTN] == 2
    hooks.remove()
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in net.modules())


def test_patterns_are_configurable_and_checked():
    net = Net(layers=1)
    _, hooks = timer_and_hooks(net, patterns={"moe": r"^MoELayer$"})
    assert hooks.matched == {"moe": 1}
    with pytest.raises(ValueError, match="not one of"):
        compile_patterns({"mlp": "MLP$"})
    with pytest.raises(ValueError, match="bad class-name pattern"):
        compile_patterns({"attention": "("})
    names = ["SelfAttention", "MLASelfAttention", "LlamaAttention", "MultiheadAttention", "MoELayer",
             "MixtralSparseMoeBlock", "Qwen2MoeSparseMoeBlock", "DeepseekV3MoE"]
    compiled = compile_patterns(DEFAULT_PATTERNS)
    assert all(any(p.search(n) for p in compiled.values()) for n in names)
    assert not any(p.search("TransformerLayer") or p.search("MLP") for p in compiled.values())


def test_analyzer_reports_module_stages_and_losses_are_unchanged():
    def train(analyzed: bool):
        torch.manual_seed(0)
        net = Net(layers=2, recompute="reentrant")
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        reports = []
        cfg = StragglerConfig(enabled=analyzed, interval=1, warmup_steps=0, enable_module_stages=True)
        analyzer = relax_straggler.install(net, opt, config=cfg, report_fn=lambda m, s, details: reports.append({**m, **details}))
        losses = []
        for step in range(3):
            idx = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(step))
            loss = F.cross_entropy(net(idx).view(-1, 32), idx.view(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        analyzer.uninstall()
        return losses, reports

    plain, _ = train(False)
    observed, reports = train(True)
    assert observed == plain  # bitwise
    assert len(reports) == 3
    for m in reports:
        assert m["straggler/attention/local_ms"] > 0 and m["straggler/moe/local_ms"] > 0
        assert m["straggler/open_at_step_end"] == 0 and m["straggler/unmatched_stops"] == 0


def test_rank_slowed_in_attention_is_named_in_attention(tmp_path):
    out = tmp_path / "reports.json"
    torchrun(2, REPO / "tests" / "python" / "workers" / "module_stages_worker.py", [str(out)], timeout_s=120)
    run = json.loads(out.read_text())
    assert_not_blocked(dict(enumerate(run["step_s"])), warmup=2, expected_steps=6)
    reports = run["reports"]
    assert len(reports) == 4
    named = [m for m in reports if m["straggler/attention/top_rank"] == 1 and m["straggler/attention/num_stragglers"] >= 1]
    assert len(named) >= 3, [(m["straggler/attention/top_rank"], m["straggler/hints"]) for m in reports]
    assert all(m["straggler/moe/num_stragglers"] == 0 for m in reports)
    assert all(not math.isnan(m["straggler/attention/max_ms"]) for m in reports)
