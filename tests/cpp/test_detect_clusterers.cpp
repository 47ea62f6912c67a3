// The six clusterers and the validity indices on small hand-made and seeded data.
// (The comparison with scikit-learn lives in tests/python/test_detect_sklearn.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <stdexcept>
#include <utility>

#include "core/detect/agglomerative.h"
#include "core/detect/coreset.h"
#include "core/detect/dbscan.h"
#include "core/detect/fuzzy_cmeans.h"
#include "core/detect/gmm.h"
#include "core/detect/keep_best.h"
#include "core/detect/kmeans.h"
#include "core/detect/mean_shift.h"
#include "core/detect/scores.h"

namespace rd = relax_straggler::core::detect;

namespace {

// Two tight 2-D blobs: `a` points around (0, 0), `b` points around (10, 10).
rd::PointMatrix blobs(int a, int b, std::uint64_t seed = 7) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0.0, 0.5);
  rd::PointMatrix x(a + b, 2);
  for (int i = 0; i < a + b; ++i) {
    const double c = i < a ? 0.0 : 10.0;
    x(i, 0) = c + noise(rng);
    x(i, 1) = c + noise(rng);
  }
  return x;
}

// True when labels put the first `a` points in one cluster and the rest in another.
bool splits_at(const rd::Labels& labels, int a) {
  std::set<std::int32_t> first(labels.begin(), labels.begin() + a);
  std::set<std::int32_t> second(labels.begin() + a, labels.end());
  return first.size() == 1 && second.size() == 1 && *first.begin() != *second.begin();
}

}  // namespace

TEST(DetectDistances, MatchDirectComputation) {
  const rd::PointMatrix x = blobs(5, 4);
  const Eigen::MatrixXd d = rd::pairwise_distances(x);
  for (int i = 0; i < x.rows(); ++i) {
    EXPECT_EQ(d(i, i), 0.0);
    for (int j = 0; j < x.rows(); ++j) EXPECT_NEAR(d(i, j), (x.row(i) - x.row(j)).norm(), 1e-9);
  }
}

TEST(DetectDistances, KDistancesCountThePointAndWeights) {
  rd::PointMatrix x(4, 1);
  x << 0.0, 1.0, 3.0, 7.0;
  const Eigen::MatrixXd d = rd::pairwise_distances(x);
  const Eigen::MatrixXd k = rd::k_distances(d, Eigen::VectorXd::Ones(4), {1.0, 2.0, 4.0});
  EXPECT_DOUBLE_EQ(k(0, 0), 0.0);  // the point itself
  EXPECT_DOUBLE_EQ(k(0, 1), 1.0);
  EXPECT_DOUBLE_EQ(k(3, 1), 4.0);
  EXPECT_DOUBLE_EQ(k(0, 2), 7.0);
  // Point 0 with weight 2 is its own 2nd neighbour.
  Eigen::VectorXd w = Eigen::VectorXd::Ones(4);
  w[0] = 2.0;
  EXPECT_DOUBLE_EQ(rd::k_distances(d, w, {2.0})(0, 0), 0.0);
}

TEST(DetectScores, SilhouetteByHand) {
  rd::PointMatrix x(4, 1);
  x << 0.0, 1.0, 10.0, 11.0;
  const rd::Labels labels{0, 0, 1, 1};
  const auto s = rd::score_partition(x, Eigen::VectorXd::Ones(4), labels, rd::pairwise_distances(x));
  // a = 1 everywhere; b = 10.5, 9.5, 9.5, 10.5.
  const double expected = ((9.5 / 10.5) * 2 + (8.5 / 9.5) * 2) / 4;
  EXPECT_NEAR(s.silhouette, expected, 1e-12);
  // Between: 2 * 5^2 * 2 = 100 over 1; within: 4 * 0.25 = 1 over 2  -> 200.
  EXPECT_NEAR(s.calinski_harabasz, 200.0, 1e-9);
  // Spreads 0.5 each, centroids 10 apart -> 0.1.
  EXPECT_NEAR(s.davies_bouldin, 0.1, 1e-12);
  EXPECT_TRUE(std::isnan(rd::score_partition(x, Eigen::VectorXd::Ones(4), {0, 0, 0, 0}, rd::pairwise_distances(x)).silhouette));
}

TEST(DetectScores, WeightEqualsDuplicatedPoints) {
  rd::PointMatrix dup(5, 1), x(4, 1);
  dup << 0.0, 0.0, 1.0, 10.0, 11.0;
  x << 0.0, 1.0, 10.0, 11.0;
  Eigen::VectorXd w = Eigen::VectorXd::Ones(4);
  w[0] = 2.0;
  const auto a = rd::score_partition(dup, Eigen::VectorXd::Ones(5), {0, 0, 0, 1, 1}, rd::pairwise_distances(dup));
  const auto b = rd::score_partition(x, w, {0, 0, 1, 1}, rd::pairwise_distances(x));
  EXPECT_NEAR(a.silhouette, b.silhouette, 1e-12);
  EXPECT_NEAR(a.calinski_harabasz, b.calinski_harabasz, 1e-9);
  EXPECT_NEAR(a.davies_bouldin, b.davies_bouldin, 1e-12);
}

TEST(DetectScores, TwoClustersBeatOne) {
  const rd::PartitionScore one{std::nan(""), std::nan(""), std::nan("")};
  const rd::PartitionScore two{0.1, 5.0, 2.0};
  EXPECT_TRUE(rd::better_partition(two, one));
  EXPECT_FALSE(rd::better_partition(one, two));
}

TEST(DetectScores, KeepBestKeepsTheFirstOfEqualsAndOnlyReplacesOnStrictlyBetter) {
  const double nan = std::nan("");
  rd::KeepBest<int> best;
  EXPECT_FALSE(best.has_value());
  best.offer(1, {nan, nan, nan});  // one cluster: kept only because it is the first
  EXPECT_TRUE(best.has_value());
  best.offer(2, {0.3, 5.0, 2.0});
  best.offer(3, {0.3 + 1e-12, 5.0, 2.0});  // equal within the silhouette tolerance: the earlier stays
  best.offer(4, {0.1, 50.0, 0.5});
  best.offer(5, {nan, nan, nan});
  EXPECT_EQ(best.take(), 2);
}

TEST(DetectScores, KeepBestTakesAnyStrictOrder) {
  rd::KeepBest<char, double> lowest([](const double& a, const double& b) { return a < b; });
  for (const auto& [c, bic] : {std::pair{'a', 3.0}, std::pair{'b', 1.0}, std::pair{'c', 1.0}, std::pair{'d', 2.0}}) {
    lowest.offer(c, bic);
  }
  EXPECT_EQ(lowest.take(), 'b');
}

TEST(DetectKMeans, SplitsBlobsAndIsDeterministic) {
  const rd::PointMatrix x = blobs(30, 10);
  rd::KMeansOptions o;
  o.seed = 3;
  const auto a = rd::kmeans(x, Eigen::VectorXd::Ones(40), o);
  const auto b = rd::kmeans(x, Eigen::VectorXd::Ones(40), o);
  EXPECT_TRUE(splits_at(a.labels, 30));
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.inertia, b.inertia);
  EXPECT_THROW(rd::kmeans(x, Eigen::VectorXd::Ones(40), rd::KMeansOptions{0, 1, 10, 0}), std::invalid_argument);
}

TEST(DetectKMeans, FewerDistinctPointsThanClusters) {
  rd::PointMatrix x = rd::PointMatrix::Zero(5, 2);
  rd::KMeansOptions o;
  o.k = 3;
  const auto r = rd::kmeans(x, Eigen::VectorXd::Ones(5), o);
  EXPECT_EQ(r.inertia, 0.0);
}

TEST(DetectDbscan, TwoClustersAndNoise) {
  rd::PointMatrix x(7, 1);
  x << 0.0, 0.1, 0.2, 5.0, 5.1, 5.2, 20.0;
  const auto labels = rd::dbscan(rd::pairwise_distances(x), Eigen::VectorXd::Ones(7), 0.15, 3.0);
  EXPECT_EQ(labels[0], labels[1]);
  EXPECT_EQ(labels[1], labels[2]);
  EXPECT_EQ(labels[3], labels[5]);
  EXPECT_NE(labels[0], labels[3]);
  EXPECT_EQ(labels[6], rd::kNoise);
  EXPECT_THROW(rd::dbscan(rd::pairwise_distances(x), Eigen::VectorXd::Ones(7), -1.0, 3.0), std::invalid_argument);
}

TEST(DetectDbscan, KneeSeparatesBodyFromOutlier) {
  rd::PointMatrix x = blobs(60, 0);
  x.row(0) << 40.0, 40.0;
  const auto r = rd::dbscan_auto(x, Eigen::VectorXd::Ones(60), rd::pairwise_distances(x), rd::DbscanOptions{});
  EXPECT_EQ(r.labels[0], rd::kNoise);
  std::set<std::int32_t> body(r.labels.begin() + 1, r.labels.end());
  EXPECT_EQ(body.count(rd::kNoise), 0u);
}

TEST(DetectGmm, SplitsBlobsWithEveryCovariance) {
  const rd::PointMatrix x = blobs(25, 15);
  for (auto c : {rd::Covariance::kFull, rd::Covariance::kTied, rd::Covariance::kDiag, rd::Covariance::kSpherical}) {
    const auto r = rd::gaussian_mixture(x, Eigen::VectorXd::Ones(40), c, rd::GmmOptions{});
    EXPECT_TRUE(splits_at(r.labels, 25)) << rd::covariance_name(c);
    EXPECT_TRUE(std::isfinite(r.bic));
    EXPECT_TRUE(r.converged);
  }
  // Two isotropic blobs of equal spread: the 5-parameter spherical model has the best BIC.
  const auto best = rd::gaussian_mixture_auto(x, Eigen::VectorXd::Ones(40), rd::GmmOptions{});
  EXPECT_EQ(best.covariance, rd::Covariance::kSpherical);
}

TEST(DetectAgglomerative, LinkagesDisagreeOnAChain) {
  // A chain 0..5 step 1 and a point at 7.5: single linkage cuts off the far point;
  // ward balances the sizes.
  rd::PointMatrix x(7, 1);
  x << 0, 1, 2, 3, 4, 5, 7.5;
  const auto d = rd::pairwise_distances(x);
  const Eigen::VectorXd w = Eigen::VectorXd::Ones(7);
  const auto single = rd::agglomerative(d, w, rd::Linkage::kSingle, 2);
  EXPECT_TRUE(splits_at(single, 6));
  const auto ward = rd::agglomerative(d, w, rd::Linkage::kWard, 2);
  EXPECT_FALSE(splits_at(ward, 6));
  EXPECT_EQ(rd::count_clusters(ward), 2);
  for (auto l : {rd::Linkage::kWard, rd::Linkage::kComplete, rd::Linkage::kAverage, rd::Linkage::kSingle}) {
    EXPECT_EQ(rd::count_clusters(rd::agglomerative(d, w, l, 3)), 3) << rd::linkage_name(l);
  }
  EXPECT_THROW(rd::agglomerative(d, w, rd::Linkage::kWard, 0), std::invalid_argument);
}

TEST(DetectAgglomerative, WeightEqualsDuplicatedPoints) {
  rd::PointMatrix dup(6, 1), x(4, 1);
  dup << 0, 0, 0, 1, 4, 9;
  x << 0, 1, 4, 9;
  Eigen::VectorXd w = Eigen::VectorXd::Ones(4);
  w[0] = 3.0;
  const auto a = rd::agglomerative(rd::pairwise_distances(dup), Eigen::VectorXd::Ones(6), rd::Linkage::kWard, 2);
  const auto b = rd::agglomerative(rd::pairwise_distances(x), w, rd::Linkage::kWard, 2);
  EXPECT_EQ(a[0] == a[4], b[0] == b[2]);
  EXPECT_EQ(a[0] == a[5], b[0] == b[3]);
}

TEST(DetectMeanShift, FindsTwoModes) {
  const rd::PointMatrix x = blobs(30, 20);
  const Eigen::VectorXd w = Eigen::VectorXd::Ones(50);
  const auto d = rd::pairwise_distances(x);
  const double bw = rd::estimate_bandwidths(d, w, {0.3})[0];
  EXPECT_GT(bw, 0.0);
  for (bool bins : {false, true}) {
    const auto r = rd::mean_shift(x, w, bw, bins, 300);
    EXPECT_EQ(r.modes.rows(), 2) << "bin_seeding=" << bins;
    EXPECT_TRUE(splits_at(r.labels, 30));
  }
  EXPECT_THROW(rd::mean_shift(x, w, 0.0, false, 300), std::invalid_argument);
}

TEST(DetectMeanShift, MergesExtraModesIntoTwoGroups) {
  // Three well-separated groups: the merge leaves two.
  rd::PointMatrix x(30, 1);
  for (int i = 0; i < 30; ++i) x(i, 0) = (i < 10 ? 0.0 : i < 20 ? 10.0 : 100.0) + 0.01 * (i % 10);
  const auto r = rd::mean_shift_auto(x, Eigen::VectorXd::Ones(30), rd::pairwise_distances(x), rd::MeanShiftOptions{});
  EXPECT_EQ(rd::count_clusters(r.labels), 2);
  EXPECT_TRUE(splits_at(r.labels, 20));
}

TEST(DetectFuzzyCMeans, MembershipsSumToOneAndSplit) {
  const rd::PointMatrix x = blobs(20, 20);
  const auto r = rd::fuzzy_cmeans(x, Eigen::VectorXd::Ones(40), 2.0, rd::FcmOptions{});
  EXPECT_TRUE(splits_at(r.labels, 20));
  for (int i = 0; i < 40; ++i) EXPECT_NEAR(r.membership.row(i).sum(), 1.0, 1e-12);
  EXPECT_GT(r.membership.minCoeff(), 0.0);
  EXPECT_THROW(rd::fuzzy_cmeans(x, Eigen::VectorXd::Ones(40), 1.0, rd::FcmOptions{}), std::invalid_argument);
}

TEST(DetectCoreset, KeepsOutliersAndCountsEveryRow) {
  rd::PointMatrix x = blobs(2000, 0);
  x.row(1234) << 30.0, 30.0;
  const auto c = rd::build_coreset(x, 64, 1);
  EXPECT_EQ(c.points.rows(), 64);
  EXPECT_DOUBLE_EQ(c.weights.sum(), 2000.0);
  EXPECT_GE(c.weights.minCoeff(), 1.0);
  EXPECT_EQ(c.points.row(c.representative[1234]), x.row(1234));
  rd::Labels rep(64, 0);
  rep[static_cast<std::size_t>(c.representative[1234])] = 1;
  const auto labels = rd::expand_labels(c, rep);
  EXPECT_EQ(labels[1234], 1);
  // Small inputs pass through unchanged.
  const auto small = rd::build_coreset(x.topRows(10), 64, 1);
  EXPECT_EQ(small.points, x.topRows(10));
  EXPECT_THROW(rd::build_coreset(x, 1, 1), std::invalid_argument);
}
