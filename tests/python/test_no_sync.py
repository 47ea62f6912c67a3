"""No synchronize inside a step, nothing at all on non-sampled steps (docs/ARCHITECTURE.md invariants 2-4),
counted rather than assumed.

The stage timer counts its read points (end_step reads of a sampled step: on CUDA the one
event synchronize) and the events it records. These tests drive real training steps and
check, step by step: exactly one read point per sampled step, at its end; none and no
event on other steps; no Python-level device synchronize and no collective on the
training thread but the one side-group gather per sampled step. The CUDA tests (run by
benchmarks/gpu/check.sh; skipped without a GPU) also show that the host never waits for
the device inside a step.
"""

import json
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import REAL_RUNS, REPO, torchrun
from workers.step_times import assert_not_blocked

import relax_straggler
from relax_straggler import StragglerConfig
from relax_straggler._ext import ext

pytestmark = REAL_RUNS

C = ext()
CUDA = torch.cuda.is_available() and bool(C.with_cuda)
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a GPU and relax_straggler._C built with CUDA")


class Attention(nn.Module):  # matched by the module-stage patterns: more sections per step
    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).relu()


class Model(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, d)
        self.attn = Attention(d)
        self.head = nn.Linear(d, 32)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(self.emb(idx)))


class SyncCounter:
    """Counts Python-level device synchronizations (monkeypatched in)."""

    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        for owner, name in ((torch.cuda, "synchronize"), (torch.cuda.Event, "synchronize"),
                            (torch.cuda.Event, "elapsed_time"), (torch.cuda.Stream, "synchronize")):
            monkeypatch.setattr(owner, name, self._count)

    def _count(self, *args, **kwargs) -> None:
        self.calls += 1


def observe_steps(device: str, steps: int, interval: int, warmup: int) -> list[dict]:
    """Trains `steps` steps under the analyzer and records, per step, the timer's read
    points and events before the step, seen from inside it (forward, gradient, optimizer
    hooks registered after the analyzer's), and after it."""
    torch.manual_seed(0)
    model = Model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    config = StragglerConfig(enabled=True, interval=interval, warmup_steps=warmup, enable_module_stages=True)
    analyzer = relax_straggler.install(model, opt, config=config)
    timer = analyzer.timer
    inside: list[int] = []
    model.register_forward_hook(lambda m, i, o: inside.append(timer.read_points))
    opt.register_step_pre_hook(lambda o, a, k: inside.append(timer.read_points))
    gen = torch.Generator().manual_seed(0)
    log = []
    for step in range(steps):
        before = (timer.read_points, timer.events_recorded)
        inside.clear()
        with analyzer.section("data"):
            x = torch.randint(0, 32, (4, 8), generator=gen).to(device)
        out = model(x)
        out.register_hook(lambda g: inside.append(timer.read_points))
        F.cross_entropy(out.view(-1, 32), x.view(-1)).backward()
        opt.step()
        opt.zero_grad()
        log.append({"step": step, "sampled": step >= warmup and step % interval == 0, "reads_before": before[0],
                    "reads_inside": list(inside), "reads": timer.read_points - before[0],
                    "events": timer.events_recorded - before[1]})
    analyzer.uninstall()
    assert timer.dropped_sections == 0 and timer.unmatched_stops == 0 and timer.open_at_step_end == 0
    return log


def check_one_read_per_sampled_step(log: list[dict]) -> None:
    assert sum(e["sampled"] for e in log) >= 3
    for e in log:
        assert e["reads"] == (1 if e["sampled"] else 0), e
        assert (e["events"] > 0) == e["sampled"], e
        # Nothing is read before the step has ended: every in-step look sees the count
        # the step started with.
        assert len(e["reads_inside"]) == 3 and set(e["reads_inside"]) == {e["reads_before"]}, e
    (events,) = {e["events"] for e in log if e["sampled"]}  # the same on every sampled step
    # Two per section; at least data, forward, attention, backward, optimizer.
    assert events % 2 == 0 and events >= 2 * 5


def test_one_read_point_per_sampled_step_and_none_otherwise(monkeypatch):
    syncs = SyncCounter(monkeypatch)
    check_one_read_per_sampled_step(observe_steps("cpu", steps=20, interval=4, warmup=3))
    assert syncs.calls == 0


def test_two_ranks_training_thread_issues_only_one_side_gather_per_sampled_step(tmp_path):
    out = tmp_path / "collectives.json"
    torchrun(2, REPO / "tests" / "python" / "workers" / "no_sync.py", [str(out), "12", "3"])
    for rank, calls in enumerate(json.loads(out.read_text())):
        sampled = [s for s in range(12) if s % 3 == 0]
        assert calls["reads_per_step"] == [1 if s in sampled else 0 for s in range(12)], rank
        # One gather per sampled step and the metrics rank's decision every 5th step
        # (--straggler-control-every 5), async on the side group; nothing on the training
        # group, no barrier, no device synchronize.
        expected = [[op, "side", s] for s in range(12)
                    for op, due in (("gather", s % 3 == 0), ("broadcast", s % 5 == 0)) if due]
        assert calls["collectives"] == expected, rank
        assert calls["synchronize"] == 0
        assert_not_blocked({rank: calls["step_s"]}, warmup=1, expected_steps=12)


# CUDA ------------------------------------------------------------------------------------

def _sleep_cycles_per_ms() -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / start.elapsed_time(end)


@cuda_only
def test_cuda_sections_never_block_the_host_and_time_the_device():
    per_ms = _sleep_cycles_per_ms()
    t = C.StageTimer(2, interval=1, use_cuda=True)
    assert t.device == "cuda"
    t.begin_step(0)
    h0 = time.perf_counter()
    t.start(0)
    torch.cuda._sleep(int(200 * per_ms))
    t.stop(0)
    t.start(1)
    torch.cuda._sleep(int(50 * per_ms))
    t.stop(1)
    host_ms = (time.perf_counter() - h0) * 1e3
    assert host_ms < 25, f"the host waited {host_ms:.1f} ms inside the step"
    assert t.read_points == 0
    s = t.end_step()
    assert t.read_points == 1
    assert s.device_ms[0] == pytest.approx(200, rel=0.2) and s.device_ms[1] == pytest.approx(50, rel=0.2)
    assert s.host_ms[0] < 25  # host time of a section is its launch time


@cuda_only
def test_cuda_non_sampled_steps_record_no_event():
    t = C.StageTimer(1, interval=2, use_cuda=True)
    t.begin_step(1)
    for _ in range(100):
        with t.section(0):
            torch.cuda._sleep(1000)
    assert not t.end_step().sampled
    assert t.events_recorded == 0 and t.read_points == 0


@cuda_only
def test_cuda_sections_on_a_side_stream_are_read_after_they_complete():
    per_ms = _sleep_cycles_per_ms()
    t = C.StageTimer(2, interval=1, use_cuda=True)
    side = torch.cuda.Stream()
    t.begin_step(0)
    with torch.cuda.stream(side):
        t.start(0)
        torch.cuda._sleep(int(100 * per_ms))
        t.stop(0)
    t.start(1)  # the last event, on the default stream, completes at once
    t.stop(1)
    s = t.end_step()
    assert s.device_ms[0] == pytest.approx(100, rel=0.2)
    assert s.device_ms[1] < 5


@cuda_only
def test_cuda_analyzer_reads_once_per_sampled_step(monkeypatch):
    syncs = SyncCounter(monkeypatch)
    log = observe_steps("cuda", steps=20, interval=4, warmup=3)
    check_one_read_per_sampled_step(log)
    assert syncs.calls == 0
