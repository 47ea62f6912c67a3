"""The C++ verdict and statistics against straightforward numpy references."""

import numpy as np
import pytest

from relax_straggler._ext import core

C = core()


def reference_verdict(ms: np.ndarray, stages: list[str], rel: float, abs_ms: float, floor: float, ref: str):
    """The rule of csrc/core/verdict.h written the obvious way."""
    out = []
    for j, stage in enumerate(stages):
        col = ms[:, j]
        finite = ~np.isnan(col)
        if not finite.any():
            out.append(None)
            continue
        r = np.nanmean(col) if ref == "mean" else np.nanmedian(col)
        comm = stage.startswith("communication")
        flagged = []
        for i, t in enumerate(col):
            if np.isnan(t):
                continue
            excess = (r - t) if comm else (t - r)
            relative = (t * rel <= r) if comm else (t >= r * rel)
            if excess >= floor and (relative or excess >= abs_ms):
                flagged.append(i)
        values = np.where(finite, col, np.inf if comm else -np.inf)
        top = int(np.argmin(values) if comm else np.argmax(values))
        out.append(dict(ref=r, max=np.nanmax(col), top=top, stragglers=flagged))
    return out


@pytest.mark.parametrize("ref", ["mean", "median"])
@pytest.mark.parametrize("seed", range(5))
def test_matches_numpy_reference(seed, ref):
    rng = np.random.default_rng(seed)
    ranks, stages = int(rng.integers(1, 64)), ["forward", "backward", "communication", "communication/allreduce", "data"]
    ms = rng.lognormal(np.log(50.0), 0.3, size=(ranks, len(stages)))
    ms[rng.random(ms.shape) < 0.1] = np.nan
    ms[rng.integers(0, ranks), 0] *= 3.0
    config = C.VerdictConfig(1.2, 5.0, 0.5, C.Reference.MEAN if ref == "mean" else C.Reference.MEDIAN)
    got = C.judge_step(ms, stages, 11, config)
    want = reference_verdict(ms, stages, 1.2, 5.0, 0.5, ref)
    assert got.step == 11
    for sv, w in zip(got.stages, want):
        if w is None:
            assert sv.top_rank == -1 and sv.ranks_reporting == 0
            continue
        assert sv.ref_ms == pytest.approx(w["ref"], rel=1e-12)
        assert sv.max_ms == pytest.approx(w["max"], rel=1e-12)
        assert sv.top_rank == w["top"]
        assert list(sv.stragglers) == w["stragglers"]


def test_shape_errors_are_value_errors():
    with pytest.raises(ValueError, match="columns"):
        C.judge_step(np.zeros((3, 2)), ["forward"], 0, C.VerdictConfig())
    with pytest.raises(ValueError, match="2-D"):
        C.judge_step(np.zeros(3), ["forward"], 0, C.VerdictConfig())
    with pytest.raises(ValueError, match="relative_threshold"):
        C.VerdictConfig(relative_threshold=float("nan"))


@pytest.mark.parametrize("seed", range(3))
def test_statistics_match_numpy(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=int(rng.integers(1, 200)))
    x[rng.random(x.shape) < 0.2] = np.nan
    if np.isnan(x).all():
        x[0] = 1.0
    assert C.nan_mean(x) == pytest.approx(np.nanmean(x))
    assert C.nan_median(x) == pytest.approx(np.nanmedian(x))
    for q in (0.0, 0.1, 0.25, 0.9, 1.0):
        assert C.nan_quantile(x, q) == pytest.approx(np.nanquantile(x, q))
    finite = x[~np.isnan(x)]
    assert C.nan_mad(x) == pytest.approx(np.median(np.abs(finite - np.median(finite))))


def reference_grouped(ms: np.ndarray, stages: list[str], groups: np.ndarray, ref: str):
    """The grouped rule of csrc/core/verdict.h from the ungrouped reference, group by group."""
    out = []
    per_group = {g: (np.flatnonzero(groups == g), reference_verdict(ms[groups == g], stages, 1.2, 5.0, 0.5, ref))
                 for g in np.unique(groups)}
    for j, stage in enumerate(stages):
        comm = stage.startswith("communication")
        found = []  # (flagged, excess, -top row, ref, stragglers as rows)
        for rows, verdict in per_group.values():
            w = verdict[j]
            if w is None:
                continue
            col = ms[rows, j]
            excess = (w["ref"] - np.nanmin(col)) if comm else (w["max"] - w["ref"])
            healthy = np.delete(col, w["stragglers"])  # a group's work: its unflagged ranks' mean
            found.append((bool(w["stragglers"]), excess, -int(rows[w["top"]]), w["ref"], rows[w["stragglers"]].tolist(),
                          np.nanmean(healthy) if np.any(~np.isnan(healthy)) else np.nan))
        if not found:
            out.append(None)
            continue
        speaker = max(found)
        work = [f[5] for f in found if f[5] > 0]
        out.append(dict(ref=speaker[3], top=-speaker[2], mean=np.nanmean(ms[:, j]),
                        stragglers=sorted(r for f in found for r in f[4]),
                        imbalance=max(work) / min(work) if not comm and len(work) >= 2 else np.nan))
    return out


@pytest.mark.parametrize("ref", ["mean", "median"])
@pytest.mark.parametrize("seed", range(6))
def test_grouped_matches_numpy_reference(seed, ref):
    rng = np.random.default_rng(100 + seed)
    ranks, stages = int(rng.integers(2, 96)), ["forward", "backward", "communication", "communication/allreduce", "data"]
    groups = rng.integers(0, int(rng.integers(2, 9)), size=ranks)  # ids out of rank order, some singletons
    work = rng.uniform(20.0, 200.0, size=(groups.max() + 1, 1))  # each group's own load
    ms = work[groups] * rng.lognormal(0.0, 0.15, size=(ranks, len(stages)))
    ms[rng.random(ms.shape) < 0.1] = np.nan
    ms[groups == groups[0], 4] = np.nan  # a stage one group never runs
    ms[rng.integers(0, ranks), 0] *= 2.0
    config = C.VerdictConfig(1.2, 5.0, 0.5, C.Reference.MEAN if ref == "mean" else C.Reference.MEDIAN)
    got = C.judge_step(ms, stages, 3, config, groups.tolist())
    for sv, w in zip(got.stages, reference_grouped(ms, stages, groups, ref)):
        if w is None:
            assert sv.top_rank == -1 and sv.ranks_reporting == 0
            continue
        assert sv.ranks_reporting == int(np.sum(~np.isnan(ms[:, stages.index(sv.stage)])))
        assert sv.ref_ms == pytest.approx(w["ref"], rel=1e-12)
        assert sv.mean_ms == pytest.approx(w["mean"], rel=1e-12)
        assert sv.top_rank == w["top"]
        assert list(sv.stragglers) == w["stragglers"]
        assert sv.imbalance_ratio == pytest.approx(w["imbalance"], rel=1e-9, nan_ok=True)
        if sv.stragglers:
            assert sv.top_rank in sv.stragglers
