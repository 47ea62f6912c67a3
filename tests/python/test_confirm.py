"""relax_straggler.judge.confirm: the Python manager of the confirmed verdict (engine in csrc/core/confirm)."""

from __future__ import annotations

import numpy as np
import pytest

from relax_straggler.judge.confirm import ConfirmConfig, ConfirmedVerdict

STAGES = ("forward", "backward", "communication")


def job(rng: np.random.Generator, ranks: int = 32, per_group: int = 8, slow: dict[int, float] | None = None) -> np.ndarray:
    """One report: 1.5 % jitter on compute, 8 % on transfers; each group all-reduces, so
    a rank's communication time includes waiting for its group's last rank."""
    t = np.empty((ranks, 3))
    t[:, 0] = 40.0 * np.exp(rng.normal(0, 0.015, ranks))
    t[:, 1] = 80.0 * np.exp(rng.normal(0, 0.015, ranks))
    for r, frac in (slow or {}).items():
        t[r, :2] *= 1.0 + frac
    arrive = t[:, 0] + t[:, 1]
    last = arrive.reshape(-1, per_group).max(axis=1).repeat(per_group)
    t[:, 2] = 25.0 * np.exp(rng.normal(0, 0.08, ranks)) + last - arrive
    return t


GROUPS = list(np.arange(32) // 8)


def test_healthy_run_confirms_nobody_and_names_no_rank() -> None:
    rng = np.random.default_rng(1)
    v = ConfirmedVerdict()
    for step in range(100):
        r = v.update(step, job(rng), STAGES, groups=GROUPS)
        assert r.straggler_ranks == ()
        assert r.metrics()["straggler/verdict/rank"] == -1
    assert r.status in ("healthy", "suspected")


def test_slow_rank_confirmed_within_three_reports_with_metrics() -> None:
    rng = np.random.default_rng(2)
    v = ConfirmedVerdict()
    for step in range(10):
        v.update(step, job(rng), STAGES, groups=GROUPS)
    results = [v.update(step, job(rng, slow={9: 0.2}), STAGES, groups=GROUPS) for step in range(10, 13)]
    r = results[-1]
    assert r.status == "straggler" and r.straggler_ranks == (9,)
    f = r.primary
    assert f.rank == 9 and f.cause == "compute" and f.since_step == 12 and f.persistent
    assert f.ratio == pytest.approx(1.2, abs=0.06)
    m = r.metrics()
    assert m["straggler/verdict/status"] == "straggler"
    assert m["straggler/verdict/rank"] == 9
    assert m["straggler/verdict/stage"] in ("forward", "backward")
    assert m["straggler/verdict/cause"] == "compute"
    assert m["straggler/verdict/since_step"] == 12
    assert m["straggler/verdict/confidence"] == pytest.approx(f.facts.reports_agreeing / f.facts.reports_seen)
    assert f.describe().startswith(f"rank 9 straggler in {f.stage} since step 12: 1.")
    assert f.describe().endswith("cause: compute")


def test_window_ensemble_confirms_a_five_percent_straggler() -> None:
    # The window path alone: the sequential test (on by default) finds it too
    # (test_confirm_sequential.py).
    rng = np.random.default_rng(3)
    plain = ConfirmedVerdict(ConfirmConfig(sequential_budget=0.0))
    windowed = ConfirmedVerdict(ConfirmConfig(window_every=10, window_size=30, sequential_budget=0.0))
    ran = 0
    first = None
    for step in range(60):
        ms = job(rng, slow={21: 0.05})
        assert plain.update(step, ms, STAGES, groups=GROUPS).straggler_ranks == ()
        r = windowed.update(step, ms, STAGES, groups=GROUPS)
        ran += r.window is not None
        if first is None and r.straggler_ranks:
            first = step
            assert r.straggler_ranks == (21,) and r.primary.by_window and r.primary.facts.window_votes >= 3
    assert ran == 6
    assert first is not None and first <= 30


def test_invalid_input_names_the_field() -> None:
    with pytest.raises(ValueError, match="noise_sigmas"):
        ConfirmConfig(noise_sigmas=0.0)
    with pytest.raises(ValueError, match="window_every"):
        ConfirmConfig(window_every=-1)
    v = ConfirmedVerdict()
    with pytest.raises(ValueError, match="shape"):
        v.update(0, np.ones((4, 2)), STAGES)
    with pytest.raises(ValueError, match="groups"):
        v.update(0, np.ones((4, 3)), STAGES, groups=[0, 0, 1])
    with pytest.raises(ValueError, match=r"workload\[2\]"):
        v.update(0, np.ones((4, 3)), STAGES, workload=[1.0, 1.0, -1.0, 1.0])
