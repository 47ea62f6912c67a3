"""The live what-if's named worker (relax_straggler.whatif.lead): the job's spread of S over
its recent healthy reports, and a worker named only when it leads by more than that spread
in `confirm` of the last `window` reports. Hand-made report sequences, then noisy ones with
fixed seeds: a healthy job whose leader rotates, and one worker slower than its spread.

    .venv/bin/python -m pytest tests/python/test_whatif_lead.py -q
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from relax_straggler.whatif.lead import LeadConfig, WhatIfLead

A, B, C, D = (0, 0), (1, 0), (0, 1), (1, 1)


def scores(leader: tuple[int, int], lead: float, base: float = 1.1) -> dict[tuple[int, int], float]:
    out = {w: base for w in (A, B, C, D)}
    out[leader] = base + lead
    return out


def test_the_spread_is_the_mad_of_the_healthy_reports_before_this_one():
    w = WhatIfLead()
    history = [1.10, 1.30, 1.20, 1.05]
    for s in history:
        w.update(s, scores(A, 0.0))
    r = w.update(1.4, scores(A, 0.0))
    x = np.array(history)
    assert r.typical == pytest.approx(np.median(x))
    assert r.spread == pytest.approx(1.4826 * np.median(np.abs(x - np.median(x))))
    assert math.isnan(WhatIfLead().update(1.2, scores(A, 0.0)).spread)


def test_a_worker_is_named_after_confirm_leads_beyond_the_spread_and_then_kept_out_of_it():
    w = WhatIfLead(LeadConfig(window=4, confirm=3))
    for s in (1.10, 1.12, 1.08):  # healthy: spread 1.4826 x 0.02 = 0.03
        assert w.update(s, scores(A, 0.0)).named is None
    named = [w.update(1.4, scores(D, 0.3)).named for _ in range(4)]
    assert named == [None, None, D, D]
    spread = w.update(1.4, scores(D, 0.3)).spread
    assert spread == pytest.approx(1.4826 * 0.02)  # the leading reports did not enter the healthy memory
    # The lead stops: released at once.
    assert w.update(1.1, scores(B, 0.001)).named is None


def test_a_lead_within_the_spread_or_a_rotating_leader_names_nobody():
    w = WhatIfLead()
    jitter = (1.0, 1.2, 1.4, 1.1)  # spread about 0.22
    for s in jitter:
        w.update(s, scores(A, 0.0))
    assert all(w.update(jitter[i % 4], scores(D, 0.1)).named is None for i in range(12))
    w = WhatIfLead()
    for s in (1.10, 1.12, 1.08):
        w.update(s, scores(A, 0.0))
    for i in range(12):  # well beyond the spread, but a different worker each report
        assert w.update(1.3, scores((A, B, C, D)[i % 4], 0.3)).named is None


def test_nobody_is_named_before_the_spread_is_known():
    w = WhatIfLead(LeadConfig(min_healthy=3))
    assert [w.update(1.5, scores(D, 0.5)).named for _ in range(3)] == [None, None, None]


def noisy(seed: int, reports: int, slow: float) -> list[tuple[float, dict]]:
    """Reports of a PP 2 x DP 2 job: each worker's score 1 + |N(0, 0.1)| (its own jitter),
    worker D + slow; S the highest score."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(reports):
        sc = {w: 1.0 + abs(rng.normal(0.0, 0.1)) for w in (A, B, C, D)}
        sc[D] += slow
        out.append((max(sc.values()), sc))
    return out


def test_a_healthy_noisy_job_names_a_worker_in_few_reports_and_a_slow_one_in_most():
    for seed in range(5):
        w = WhatIfLead()
        healthy = [w.update(s, sc).named for s, sc in noisy(seed, 200, 0.0)]
        assert sum(n is not None for n in healthy) <= 0.10 * len(healthy), seed
        w = WhatIfLead()
        slowed = [w.update(s, sc).named for s, sc in noisy(seed, 40, 0.3)]
        assert all(n in (None, D) for n in slowed)
        assert sum(n == D for n in slowed[5:]) >= 0.8 * len(slowed[5:]), (seed, slowed)


def test_invalid_settings_name_the_field():
    with pytest.raises(ValueError, match="confirm"):
        LeadConfig(window=2, confirm=3)
    with pytest.raises(ValueError, match="min_healthy"):
        LeadConfig(min_healthy=1)
    with pytest.raises(ValueError, match="memory"):
        LeadConfig(memory=0)
    with pytest.raises(ValueError, match="slowdown"):
        WhatIfLead().update(float("nan"), scores(A, 0.0))
    with pytest.raises(ValueError, match="scores"):
        WhatIfLead().update(1.0, {})
