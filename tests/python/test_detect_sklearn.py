"""The six clusterers and the validity indices against scikit-learn (the test oracle).

Well-separated blobs: adjusted Rand index >= 0.95 against sklearn's labels with the
same hyper-parameters. Straggler windows: the same slow ranks as sklearn's clusterer
configured with the hyper-parameter our grid search chose. Fuzzy C-Means has no sklearn
counterpart; it is held to sklearn's KMeans, which it equals on well-separated data.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")
from sklearn import cluster as skc  # noqa: E402
from sklearn import metrics as skm  # noqa: E402
from sklearn.datasets import make_blobs  # noqa: E402
from sklearn.mixture import GaussianMixture  # noqa: E402

from relax_straggler._ext import core  # noqa: E402
from relax_straggler.window import detector as detect

SEEDS = (0, 1, 2)


def blobs(seed: int, n: int = 240) -> np.ndarray:
    x, _ = make_blobs(n_samples=[n * 3 // 4, n // 4], n_features=4, centers=None, cluster_std=0.6,
                      center_box=(-10, 10), random_state=seed)
    return x


def ari(a: np.ndarray, b: np.ndarray) -> float:
    return skm.adjusted_rand_score(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("seed", SEEDS)
def test_kmeans(seed):
    x = blobs(seed)
    ours = core().detect.kmeans(x, None, 2, 3, seed)
    theirs = skc.KMeans(2, n_init=3, random_state=seed).fit_predict(x)
    assert ari(ours, theirs) >= 0.95


@pytest.mark.parametrize("seed", SEEDS)
def test_dbscan(seed):
    x = blobs(seed)
    eps = 1.5
    ours = core().detect.dbscan(x, None, eps, 5.0)
    theirs = skc.DBSCAN(eps=eps, min_samples=5).fit_predict(x)
    assert ari(ours, theirs) >= 0.95
    assert (np.asarray(ours) == -1).sum() == (theirs == -1).sum()  # same noise points: core sets agree


@pytest.mark.parametrize("covariance", ["full", "tied", "diag", "spherical"])
@pytest.mark.parametrize("seed", SEEDS)
def test_gaussian_mixture(seed, covariance):
    x = blobs(seed)
    labels, bic = core().detect.gaussian_mixture(x, None, covariance, 2, seed)
    gm = GaussianMixture(2, covariance_type=covariance, random_state=seed).fit(x)
    assert ari(labels, gm.predict(x)) >= 0.95
    assert bic == pytest.approx(gm.bic(x), rel=1e-3)


@pytest.mark.parametrize("linkage", ["ward", "complete", "average", "single"])
@pytest.mark.parametrize("seed", SEEDS)
def test_agglomerative(seed, linkage):
    x = blobs(seed)
    ours = core().detect.agglomerative(x, None, linkage, 2)
    theirs = skc.AgglomerativeClustering(2, linkage=linkage).fit_predict(x)
    assert ari(ours, theirs) >= 0.95


@pytest.mark.parametrize("seed", SEEDS)
def test_mean_shift(seed):
    x = blobs(seed, n=160)
    bw = core().detect.estimate_bandwidth(x, None, 0.3)
    assert bw == pytest.approx(skc.estimate_bandwidth(x, quantile=0.3), rel=1e-9)
    for bins in (False, True):
        ours = core().detect.mean_shift(x, None, bw, bins)
        theirs = skc.MeanShift(bandwidth=bw, bin_seeding=bins).fit_predict(x)
        assert ari(ours, theirs) >= 0.95


@pytest.mark.parametrize("seed", SEEDS)
def test_fuzzy_cmeans_equals_kmeans_on_blobs(seed):
    x = blobs(seed)
    labels, membership = core().detect.fuzzy_cmeans(x, None, 2.0, 2, seed)
    theirs = skc.KMeans(2, n_init=3, random_state=seed).fit_predict(x)
    assert ari(labels, theirs) >= 0.95
    np.testing.assert_allclose(np.asarray(membership).sum(axis=1), 1.0, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_validity_indices(seed):
    x = blobs(seed)
    labels = skc.KMeans(2, n_init=1, random_state=seed).fit_predict(x)
    labels[:3] = -1  # noise counts as one more cluster, as in sklearn
    sil, ch, db = core().detect.score_partition(x, None, labels.tolist())
    assert sil == pytest.approx(skm.silhouette_score(x, labels), rel=1e-9)
    assert ch == pytest.approx(skm.calinski_harabasz_score(x, labels), rel=1e-9)
    assert db == pytest.approx(skm.davies_bouldin_score(x, labels), rel=1e-9)


@pytest.mark.parametrize("algorithm", detect.ALGORITHMS)
@pytest.mark.parametrize("seed", SEEDS)
def test_ensemble_clusterers_recover_blobs(seed, algorithm):
    x, truth = make_blobs(n_samples=[150, 30], n_features=4, cluster_std=0.5, center_box=(-10, 10), random_state=seed)
    labels, _ = detect.cluster(x, algorithm)
    assert ari(labels, truth) >= 0.95


# --- straggler windows --------------------------------------------------------------------

def straggler_points(seed: int, slowdown: float, ranks: int = 64, steps: int = 60) -> np.ndarray:
    """Robust-scaled [min, max, range, mean] of one compute stage, rank 13 slower."""
    rng = np.random.default_rng(seed)
    t = 50.0 * np.exp(rng.normal(0.0, 0.02, (steps, ranks)))
    t[:, 13] *= 1.0 + slowdown
    f = np.stack([t.min(0), t.max(0), t.max(0) - t.min(0), t.mean(0)], axis=1)
    med = np.median(f, axis=0)
    mad = 1.4826 * np.median(np.abs(f - med), axis=0)
    return (f - med) / mad


def slow_set(labels: np.ndarray, mean_feature: np.ndarray) -> set[int]:
    """Ranks outside the largest group in groups with a higher mean (noise: own groups)."""
    labels = np.asarray(labels).copy()
    noise = labels == -1
    labels[noise] = labels.max() + 1 + np.arange(noise.sum())
    values, counts = np.unique(labels, return_counts=True)
    main = values[np.argmax(counts)]
    main_mean = mean_feature[labels == main].mean()
    return {int(i) for i in np.flatnonzero(labels != main)
            if mean_feature[labels == labels[i]].mean() > main_mean}


def sklearn_equivalent(algorithm: str, chosen: str, x: np.ndarray, seed: int) -> np.ndarray:
    value = chosen.split("=", 1)[1]
    if algorithm == "kmeans":
        return skc.KMeans(2, n_init=3, random_state=seed).fit_predict(x)
    if algorithm == "dbscan":
        return skc.DBSCAN(eps=float(value), min_samples=8).fit_predict(x)
    if algorithm == "gmm":
        return GaussianMixture(2, covariance_type=value, random_state=seed).fit_predict(x)
    if algorithm == "agglomerative":
        return skc.AgglomerativeClustering(2, linkage=value).fit_predict(x)
    if algorithm == "mean_shift":
        # sklearn's modes, merged into two groups as ours are: a weighted 2-means over the modes.
        ms = skc.MeanShift(bandwidth=float(value), bin_seeding=True).fit(x)
        if len(ms.cluster_centers_) <= 2:
            return ms.labels_
        sizes = np.bincount(ms.labels_, minlength=len(ms.cluster_centers_))
        groups = skc.KMeans(2, n_init=3, random_state=seed).fit_predict(ms.cluster_centers_, sample_weight=sizes)
        return groups[ms.labels_]
    return skc.KMeans(2, n_init=3, random_state=seed).fit_predict(x)  # fuzzy_cmeans


@pytest.mark.parametrize("algorithm", detect.ALGORITHMS)
@pytest.mark.parametrize("slowdown", [0.1, 0.5])
@pytest.mark.parametrize("seed", SEEDS)
def test_same_slow_cluster_as_sklearn_on_straggler_windows(seed, slowdown, algorithm):
    x = straggler_points(seed, slowdown)
    labels, chosen = detect.cluster(x, algorithm)
    assert re.fullmatch(r"[a-z_]+=[\w.+-]+", chosen)
    ours = slow_set(labels, x[:, 3])
    theirs = slow_set(sklearn_equivalent(algorithm, chosen, x, seed), x[:, 3])
    assert ours == theirs == {13}
