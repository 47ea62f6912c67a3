"""The RunAttributor binding (relax_straggler._core): shapes, errors and one worked case.
The rules themselves are pinned by tests/cpp/test_attribute.cpp."""

from __future__ import annotations

import math

import numpy as np
import pytest

from relax_straggler._ext import core


@pytest.fixture(scope="module")
def C():
    return core()


def test_individual_and_explained_wait(C):
    run = C.RunAttributor(2, 2, ["forward"], C.AttributionConfig())
    compute = np.array([[300.0], [100.0], [100.0], [100.0]])  # worker 0 = dp 0 / pp 0
    p2p = np.full((4, 4), np.nan)
    p2p[0, 0] = p2p[1, 0] = 10.0  # forward-send on pp 0
    p2p[2, 1], p2p[3, 1] = 150.0, 10.0  # forward-recv on pp 1: dp 0 waits
    sa = run.add_step(7, compute, p2p, 1000.0)
    assert sa.budget_ms == 1000.0
    # dp = 2: the reference is the other replica (the median of two would be their mean).
    assert [(f.kind, f.worker, f.ms, f.ref_ms) for f in sa.flags] == [("individual", 0, 300.0, 100.0)]
    assert [(f.worker, f.op, f.cause, f.blamed_worker) for f in sa.p2p_findings] == [
        (2, "forward-recv", "explained", 0)]
    refs = run.peer_refs(sa)
    assert refs.shape == (2, 1) and refs[0, 0] == 200.0
    r = run.finish()
    assert r.steps == 1
    f = r.findings[0]
    assert (f.kind, f.worker, f.stage, f.op, f.persistent, f.waits_explained) == ("individual", 0, 0, None, True, 1)
    assert f.mean_ratio == pytest.approx(3.0)


def test_shape_errors_are_value_errors(C):
    run = C.RunAttributor(2, 1, ["forward", "backward"], C.AttributionConfig())
    with pytest.raises(ValueError, match=r"compute_ms must have shape \(2, 2\), got \(2, 1\)"):
        run.add_step(0, np.zeros((2, 1)))
    with pytest.raises(ValueError, match="p2p_ms must have shape"):
        run.add_step(0, np.zeros((2, 2)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="min_impact must be in"):
        C.AttributionConfig(min_impact=1.5)
    with pytest.raises(ValueError, match="dp >= 1"):
        C.RunAttributor(0, 1, ["forward"], C.AttributionConfig())


def test_config_defaults_match_the_documented_rules(C):
    c = C.AttributionConfig()
    assert (c.relative_threshold, c.absolute_ms_threshold, c.p2p_ratio, c.jump_ratio, c.baseline_ratio) == (
        1.2, 5.0, 1.3, 2.0, 2.0)
    assert math.isclose(c.min_impact, 0.02) and c.persistence == 0.5
    assert C.P2P_OPS == ("forward-send", "forward-recv", "backward-send", "backward-recv")
