"""report_fn gets numbers only unless it takes `details`; the TensorBoard helper writes
each number with add_scalar."""

import numbers

import numpy as np
import torch

import relax_straggler
from relax_straggler import StragglerConfig
from relax_straggler.reporters import tensorboard
from relax_straggler.reporters.callback import split_metrics, takes_details


def run(report_fn, steps: int = 8) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    analyzer = relax_straggler.install(model, opt, report_fn=report_fn, config=StragglerConfig(
        enabled=True, interval=2, warmup_steps=2, quiet=True))
    for _ in range(steps):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    analyzer.uninstall()


def is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def test_report_fn_gets_numbers_only():
    got = []
    run(lambda metrics, step: got.append((step, metrics)))
    assert [s for s, _ in got] == [2, 4, 6]
    for _, metrics in got:
        assert metrics and all(is_number(v) for v in metrics.values()), \
            {k: v for k, v in metrics.items() if not is_number(v)}
        assert "straggler/forward/mean_ms" in metrics
        assert "straggler/verdict/status" not in metrics


def test_a_report_fn_with_details_gets_the_rest():
    got = []
    run(lambda metrics, step, details: got.append((metrics, details)))
    for metrics, details in got:
        assert all(is_number(v) for v in metrics.values())
        assert details["straggler/verdict/status"] == "insufficient_evidence"  # one rank: no group to compare with
        assert not any(is_number(v) for v in details.values())
        assert not set(metrics) & set(details)


def test_split_keeps_every_key_once():
    nums, details = split_metrics({"a": 1, "b": 2.5, "c": np.float32(3), "d": np.int64(4), "e": "x", "f": [1],
                                   "g": True, "h": float("nan")})
    assert set(nums) == {"a", "b", "c", "d", "h"}
    assert set(details) == {"e", "f", "g"}


def test_takes_details_by_name_or_kwargs():
    assert takes_details(lambda m, s, details: None)
    assert takes_details(lambda m, s, **kw: None)
    assert not takes_details(lambda m, s: None)
    assert not takes_details(print)  # a builtin: the two-argument form


class FakeWriter:
    """What a torch.utils.tensorboard SummaryWriter offers the helper: add_scalar."""

    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int]] = []

    def add_scalar(self, tag: str, value, step: int) -> None:
        assert isinstance(tag, str) and is_number(value) and isinstance(step, int), (tag, value, step)
        self.scalars.append((tag, value, step))


def test_tensorboard_writes_every_number_of_every_report():
    writer = FakeWriter()
    got = []
    fn = tensorboard(writer)
    run(lambda metrics, step: (got.append((step, dict(metrics))), fn(metrics, step)))
    assert writer.scalars == [(k, v, s) for s, m in got for k, v in m.items()]
    assert {s for _, _, s in writer.scalars} == {2, 4, 6}
    assert ("straggler/forward/mean_ms" in {t for t, _, _ in writer.scalars})
