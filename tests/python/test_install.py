"""install()/uninstall() in one process: hooks, stages measured, failure isolation."""

import json
import logging
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import relax_straggler
from relax_straggler import StragglerConfig
from relax_straggler.reporters import CallbackSink


def hook_count(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    n = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) + len(m._backward_hooks) +
            len(m._backward_pre_hooks) for m in model.modules())
    return n + len(optimizer._optimizer_step_pre_hooks) + len(optimizer._optimizer_step_post_hooks)


class TokenModel(nn.Module):
    """Fed integer token ids: its inputs need no grad (the case that breaks module
    backward hooks)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 32)
        self.mlp = nn.Sequential(nn.Linear(32, 256), nn.GELU(), nn.Linear(256, 64))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.emb(idx))


def train(model, optimizer, analyzer, steps: int, seed: int = 0) -> list[float]:
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        with analyzer.section("data"):
            x = torch.randint(0, 64, (16, 32), generator=gen)
        out = model(x)
        loss = F.cross_entropy(out.view(-1, 64), x.view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def make(seed: int = 0):
    torch.manual_seed(seed)
    model = TokenModel()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def config(**kw) -> StragglerConfig:
    return StragglerConfig(enabled=True, interval=1, warmup_steps=0, **kw)


def test_disabled_registers_nothing_and_sections_are_one_shared_no_op():
    model, opt = make()
    analyzer = relax_straggler.install(model, opt, config=StragglerConfig(enabled=False))
    assert hook_count(model, opt) == 0
    assert not analyzer.enabled
    assert analyzer.section("data") is analyzer.section("forward") is relax_straggler.section("anything")
    train(model, opt, analyzer, 3)
    analyzer.uninstall()


def test_uninstall_removes_every_hook():
    model, opt = make()
    analyzer = relax_straggler.install(model, opt, config=config(enable_module_stages=True))
    assert hook_count(model, opt) > 0
    train(model, opt, analyzer, 3)
    analyzer.uninstall()
    assert hook_count(model, opt) == 0
    assert relax_straggler.section("data") is not analyzer.section("data")  # module-level falls back to no-op


def test_every_stage_is_measured_and_backward_is_not_zero():
    model, opt = make()
    reports = []
    analyzer = relax_straggler.install(model, opt, config=config(), report_fn=lambda m, s: reports.append((s, m)))
    train(model, opt, analyzer, 10)
    analyzer.uninstall()
    assert [s for s, _ in reports] == list(range(10))
    for _, m in reports:
        for stage in ("forward", "backward", "optimizer", "data"):
            assert m[f"straggler/{stage}/local_ms"] > 0, stage
        assert "straggler/communication/local_ms" not in m  # not DDP: no gradient sync to time
    # The backward boundary comes from the autograd engine, not a module hook that fires
    # at the start of backward for integer inputs (which reads ~0 ms, under 1 % of forward).
    # Backward of this MLP costs about as much as its forward; the fastest of each after the
    # first (warm-up) steps, as a loaded host only adds to a stage's time (beside two busy
    # processes one forward's median was 10x its backward's).
    forward, backward = (min(m[f"straggler/{s}/local_ms"] for _, m in reports[2:]) for s in ("forward", "backward"))
    assert backward > 0.1 * forward


def test_sampling_follows_interval_and_warmup():
    model, opt = make()
    steps = []
    analyzer = relax_straggler.install(model, opt, config=StragglerConfig(enabled=True, interval=3, warmup_steps=4),
                                       report_fn=lambda m, s: steps.append(s))
    train(model, opt, analyzer, 13)
    analyzer.uninstall()
    assert steps == [6, 9, 12]
    assert analyzer.timer.read_points == 3


def test_step_label_names_each_report_in_every_sink(tmp_path):
    """install(step_label=...): the training loop's own step numbers (here 1000 + the
    analyzer's count, as in a run resumed at step 1000) in the callback and the JSONL file
    alike."""
    model, opt = make()
    steps = []
    jsonl = tmp_path / "reports.jsonl"
    analyzer = relax_straggler.install(model, opt, config=StragglerConfig(enabled=True, interval=3, warmup_steps=4,
                                                                         jsonl_path=str(jsonl)),
                                       report_fn=lambda m, s: steps.append(s), step_label=lambda s: 1000 + s)
    train(model, opt, analyzer, 13)
    analyzer.uninstall()
    assert steps == [1006, 1009, 1012]
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1006, 1009, 1012]


def test_observing_does_not_change_losses():
    model, opt = make(3)
    plain = train(model, opt, relax_straggler.install(model, opt, config=StragglerConfig()), 8, seed=1)
    model, opt = make(3)
    analyzer = relax_straggler.install(model, opt, config=config())
    observed = train(model, opt, analyzer, 8, seed=1)
    analyzer.uninstall()
    assert observed == plain  # bitwise


def test_a_raising_report_fn_does_not_stop_training(caplog):
    model, opt = make()

    def bad(metrics, step):
        raise RuntimeError("sink is down")

    seen = []
    with caplog.at_level(logging.WARNING, logger="relax_straggler"):
        analyzer = relax_straggler.install(model, opt, config=config(), report_fn=bad)
        analyzer._pipeline._sinks.append(CallbackSink(lambda metrics, step: seen.append(step)))
        losses = train(model, opt, analyzer, 5)
        analyzer.uninstall()
    assert len(losses) == 5 and seen == [0, 1, 2, 3, 4]
    warnings = [r for r in caplog.records if "raised" in r.getMessage()]
    assert len(warnings) == 1


def test_a_full_report_queue_drops_and_counts():
    model, opt = make()
    import threading

    busy, gate = threading.Event(), threading.Event()
    got = []

    def slow(metrics, step):
        busy.set()
        gate.wait(10)
        got.append(metrics["straggler/dropped_reports"])

    analyzer = relax_straggler.install(model, opt, config=config(queue_size=1), report_fn=slow)
    train(model, opt, analyzer, 1)
    assert busy.wait(10)  # the report thread holds step 0 in the sink
    train(model, opt, analyzer, 5)
    dropped = analyzer.counters()["dropped_reports"]
    gate.set()
    analyzer.uninstall()
    # One report was being built, one waited in the queue, the other four were dropped.
    assert dropped == 4
    assert len(got) == 2


def test_manual_step_without_optimizer_and_unknown_section():
    model, _ = make()
    steps = []
    analyzer = relax_straggler.install(model, None, config=config(), report_fn=lambda m, s: steps.append(s))
    for _ in range(3):
        with analyzer.section("forward"):
            model(torch.randint(0, 64, (2, 4)))
        analyzer.step()
    with pytest.raises(ValueError, match="unknown stage 'fwd'"):
        analyzer.section("fwd")
    analyzer.uninstall()
    assert steps == [0, 1, 2]


@pytest.mark.parametrize("enabled", [True, False])
def test_workload_and_stage_names_are_checked_the_same_on_and_off(enabled):
    model, opt = make()
    analyzer = relax_straggler.install(model, opt, config=StragglerConfig(enabled=enabled, interval=1, warmup_steps=0))
    for good in (32, 7.5, torch.tensor(32), np.int64(32), np.float32(3.0)):
        analyzer.set_workload(good)
    for bad in (0, -5, math.nan, "10", True, torch.tensor([1, 2])):
        with pytest.raises(ValueError, match="tokens"):
            analyzer.set_workload(bad)
    with pytest.raises(ValueError, match="unknown stage 'dta'"):
        analyzer.section("dta")
    analyzer.uninstall()


def test_a_second_install_warns_and_uninstalling_it_keeps_the_first(caplog):
    model, opt = make()
    first = relax_straggler.install(model, opt, config=config())
    with caplog.at_level(logging.WARNING, logger="relax_straggler"):
        second = relax_straggler.install(model, opt, config=config())
    assert any("already installed" in r.getMessage() for r in caplog.records)
    assert relax_straggler.section("data") is second.section("data")
    second.uninstall()
    assert relax_straggler.section("data") is first.section("data")
    first.uninstall()
    assert hook_count(model, opt) == 0


def test_optimizer_without_hooks_is_a_type_error():
    class NotAnOptimizer:
        def step(self):
            pass

    with pytest.raises(TypeError, match="optimizer=None"):
        relax_straggler.install(nn.Linear(2, 2), NotAnOptimizer(), config=config())
