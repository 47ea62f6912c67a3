"""The live what-if's named worker (relax_straggler.whatif.lead): S's noise from report to
report, and a worker named only when it led in more of the last `window` reports than a
rotating leader would and by more than that spread in `confirm` of them. Hand-made report
sequences, then noisy ones with fixed seeds: a healthy job whose leader rotates, and one
worker slower than its spread.

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


def test_the_spread_is_s_noise_from_report_to_report_and_the_typical_s_that_of_reports_naming_nobody():
    w = WhatIfLead()
    history = [1.10, 1.30, 1.20, 1.05]
    for s in history:
        w.update(s, scores(A, 0.0))
    r = w.update(1.4, scores(A, 0.0))
    x = np.array(history)
    assert r.typical == pytest.approx(np.median(x))
    assert r.spread == pytest.approx(1.4826 * np.median(np.abs(np.diff(x))) / math.sqrt(2))
    assert math.isnan(WhatIfLead().update(1.2, scores(A, 0.0)).spread)
    w = WhatIfLead()  # S that never moves: the spread is its floor, as published
    spreads = [w.update(1.1, scores(A, 0.0)).spread for _ in range(5)]
    assert spreads[3:] == [0.02, 0.02]


def test_a_slow_worker_lifting_s_for_good_does_not_widen_the_spread():
    w = WhatIfLead()
    for s in (1.10, 1.12, 1.08, 1.11):
        w.update(s, scores(A, 0.0))
    before = w.update(1.09, scores(A, 0.0)).spread
    for _ in range(8):  # S jumps to 1.4 and stays: one large difference among small ones
        r = w.update(1.4, scores(D, 0.3))
    assert r.named == D and r.spread <= before * 1.01


def test_a_low_first_spread_does_not_stick():
    # Three quiet reports, then S moving by +-0.1 report to report while one worker leads by
    # 0.05 every report: within the job's noise, so it is soon named no more (a spread learned
    # from healthy reports alone, excluding those with a lead beyond it, stayed at 0.0015
    # and named such a worker in 97 % of reports).
    w = WhatIfLead()
    for s in (1.100, 1.101, 1.102):
        w.update(s, scores(A, 0.0))
    named = [w.update(1.2 + (0.1 if i % 2 else -0.1), scores(D, 0.05)).named for i in range(60)]
    assert sum(n is not None for n in named[10:]) == 0, named


def test_scores_that_are_not_finite_are_left_out():
    for order in (0, 3):  # wherever the NaN sits among the scores
        w = WhatIfLead()
        for s in (1.10, 1.12, 1.08, 1.11):
            w.update(s, scores(A, 0.0))
        for _ in range(5):
            sc = scores(D, 0.3)
            items = list(sc.items())
            items.insert(order, ((9, 9), float("nan")))
            r = w.update(1.4, dict(items))
        assert r.leader == D and r.named == D and math.isfinite(r.lead)
    with pytest.raises(ValueError, match="finite score"):
        WhatIfLead().update(1.2, {A: float("nan")})


def test_the_leads_needed_are_those_a_rotating_leader_rarely_reaches():
    w = WhatIfLead(LeadConfig(window=5, chance=0.1))
    # 2 workers: 4 of 5 happens to one of them in 2 x 6 / 32 = 37.5 % of reports, 5 of 5 in 6.25 %.
    assert w.leads_needed(2) == 5
    # 4 workers: 4 x P(Bin(5, 1/4) >= 4) = 6.25 %, >= 3: 41 %.
    assert w.leads_needed(4) == 4
    assert w.leads_needed(100) == 2  # 100 x 10 / 100^2 = 0.1 %, >= 1: 5 x 100 / 100 > 1


def test_a_worker_is_named_after_the_leads_needed_and_then_kept_out_of_it():
    w = WhatIfLead(LeadConfig(window=5, confirm=2))
    for s in (1.10, 1.12, 1.08):  # healthy: spread 1.4826 x 0.02 = 0.03
        assert w.update(s, scores(A, 0.0)).named is None
    named = [w.update(1.4, scores(D, 0.3)).named for _ in range(5)]
    assert named == [None, None, None, D, D]
    # Another worker's noise outgrows it for one report: nobody that report, named again at
    # its next lead (4 of the last 5).
    assert w.update(1.1, scores(B, 0.001)).named is None
    assert w.update(1.4, scores(D, 0.3)).named == D
    # Leads within the spread alone do not name it: 2 of the last 5 beyond is the least.
    for _ in range(3):
        w.update(1.1, scores(A, 0.0))
    named = [w.update(1.11, scores(D, 0.005)).named for _ in range(5)]
    assert named == [None] * 5


def test_leading_beyond_the_spread_once_is_not_enough():
    w = WhatIfLead()
    for s in (1.10, 1.12, 1.08):
        w.update(s, scores(A, 0.0))
    leads = (0.3, 0.005, 0.005, 0.005, 0.005, 0.005)  # D leads every report, beyond the spread once
    assert all(w.update(1.1 + lead, scores(D, lead)).named is None for lead in leads)


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
    w = WhatIfLead(LeadConfig(min_reports=3))
    assert [w.update(1.5, scores(D, 0.5)).named for _ in range(3)] == [None, None, None]


def noisy(seed: int, reports: int, slow: float, workers: tuple = (A, B, C, D)) -> list[tuple[float, dict]]:
    """Reports of a job of `workers` (PP 2 x DP 2 by default): each worker's score
    1 + |N(0, 0.1)| (its own jitter), the last worker + slow; S the highest score."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(reports):
        sc = {w: 1.0 + abs(rng.normal(0.0, 0.1)) for w in workers}
        sc[workers[-1]] += slow
        out.append((max(sc.values()), sc))
    return out


@pytest.mark.parametrize("workers", [(A, B, C, D), (A, B)], ids=["PP 2 x DP 2", "DP 2"])
def test_a_healthy_noisy_job_names_a_worker_in_few_reports_and_a_slow_one_in_most(workers):
    slow = workers[-1]
    for seed in range(5):
        w = WhatIfLead()
        healthy = [w.update(s, sc).named for s, sc in noisy(seed, 200, 0.0, workers)]
        assert sum(n is not None for n in healthy) <= 0.10 * len(healthy), seed
        w = WhatIfLead()
        slowed = [w.update(s, sc).named for s, sc in noisy(seed, 40, 0.3, workers)]
        assert all(n in (None, slow) for n in slowed)
        assert sum(n == slow for n in slowed[5:]) >= 0.8 * len(slowed[5:]), (seed, slowed)


def test_invalid_settings_name_the_field():
    with pytest.raises(ValueError, match="confirm"):
        LeadConfig(window=2, confirm=3)
    with pytest.raises(ValueError, match="chance"):
        LeadConfig(chance=1.0)
    with pytest.raises(ValueError, match="min_reports"):
        LeadConfig(min_reports=2)
    with pytest.raises(ValueError, match="chance"):
        LeadConfig(chance="0.1")
    with pytest.raises(ValueError, match="min_spread"):
        LeadConfig(min_spread=None)
    assert LeadConfig(window=np.int64(5)).window == 5
    with pytest.raises(ValueError, match="memory"):
        LeadConfig(memory=0)
    for bad in (float("nan"), True, "1.1"):
        with pytest.raises(ValueError, match="slowdown"):
            WhatIfLead().update(bad, scores(A, 0.0))
    with pytest.raises(ValueError, match="scores"):
        WhatIfLead().update(1.0, {})
