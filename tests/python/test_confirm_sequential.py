"""The confirmed verdict's sequential test (csrc/core/confirm/sequential.h) on synthetic 4-rank
DDP reports with jitter larger than the shift: every rank sleeps U(0, 15) ms (or a
heavy-tailed log-normal plus Pareto spikes) in forward; from report 60 rank 2 sleeps 7.3 ms
more (8 % of a ~90 ms step), which no single report shows. The engine must confirm rank 2
exactly when a plain numpy CUSUM over the ranks' places reaches log(cells / budget), within
30 reports, and name nobody in healthy runs. Fixed seeds.

    .venv/bin/python -m pytest tests/python/test_confirm_sequential.py -q
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from relax_straggler.judge.confirm import ConfirmConfig, ConfirmedVerdict

STAGES = ("forward", "backward", "optimizer", "communication", "data")
ONSET, SHIFT_MS, TILT = 60, 7.3, 3.3


def reports(seed: int, steps: int, shift_ms: float, heavy: bool) -> np.ndarray:
    """(steps, 4, stages) ms: forward 7.5 + the sleep, backward 38, optimizer 5, data 1, the
    all-reduce waiting for the last rank."""
    rng = np.random.default_rng(seed)
    out = np.empty((steps, 4, len(STAGES)))
    for s in range(steps):
        if heavy:
            sleep = rng.lognormal(math.log(6.0), 0.5, 4)
            spikes = rng.random(4) < 0.03
            sleep[spikes] += 15.0 * (1.0 + rng.pareto(1.5, int(spikes.sum())))
        else:
            sleep = rng.uniform(0.0, 15.0, 4)
        t = np.empty((4, len(STAGES)))
        t[:, 0] = 7.5 + sleep + (shift_ms if s >= ONSET else 0.0) * (np.arange(4) == 2)
        t[:, 1] = 38.0 * np.exp(rng.normal(0.0, 0.03, 4))
        t[:, 2] = 5.0 * np.exp(rng.normal(0.0, 0.03, 4))
        t[:, 4] = np.exp(rng.normal(0.0, 0.1, 4))
        arrive = t[:, [0, 1, 4]].sum(axis=1)
        t[:, 3] = 25.0 * np.exp(rng.normal(0.0, 0.08, 4)) + arrive.max() - arrive
        out[s] = t
    return out


def oracle_alarm(ms: np.ndarray, budget: float, start: int) -> int:
    """The first report >= start at which rank 2's forward CUSUM reaches its level, by the
    rule written out: place among the 3 others, score exp(TILT p / 3) / mean, W clipped to
    [0, h], h = log(16 cells / budget) (4 ranks x 4 compute stages)."""
    e = np.exp(TILT * np.arange(4) / 3)
    log_score = np.log(e / e.mean())
    h = math.log(16 / budget)
    w = 0.0
    for s in range(ms.shape[0]):
        if s >= 2:  # the engine judges a stage once it learned its noise from min_reports reports
            place = int((ms[s, :, 0] < ms[s, 2, 0]).sum())
            w = min(max(w + log_score[place], 0.0), h)
        if s >= start and w >= h:
            return s
    return -1


def named(ms: np.ndarray, budget: float = 1e-3) -> list[tuple[int, int, bool]]:
    """(report, rank, by_sequential) of every straggler finding."""
    verdict = ConfirmedVerdict(ConfirmConfig(sequential_budget=budget))
    out = []
    for s in range(ms.shape[0]):
        r = verdict.update(s, ms[s], STAGES)
        out += [(s, f.rank, f.by_sequential) for f in r.findings if f.state == "straggler"]
    return out


@pytest.mark.parametrize("seed", range(5))
def test_an_eight_percent_rank_under_uniform_jitter_is_confirmed_when_the_cusum_says(seed):
    ms = reports(seed, ONSET + 40, SHIFT_MS, heavy=False)
    found = named(ms)
    assert {rank for _, rank, _ in found} == {2}, found
    first, _, sequential = found[0]
    assert sequential and first >= ONSET
    assert first == oracle_alarm(ms, 1e-3, ONSET)
    assert first - ONSET <= 30
    # Off, the per-report rules and the window never see it.
    assert named(ms, budget=0.0) == []


@pytest.mark.parametrize("heavy", [False, True])
def test_healthy_jittery_runs_confirm_nobody(heavy):
    for seed in range(5):
        ms = reports(100 + seed, 300, 0.0, heavy=heavy)
        assert named(ms) == [], seed


def test_the_budget_is_checked():
    with pytest.raises(ValueError, match="sequential_budget"):
        ConfirmConfig(sequential_budget=1.5)
