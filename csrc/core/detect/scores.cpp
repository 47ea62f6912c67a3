#include "core/detect/scores.h"

#include <cmath>
#include <limits>

namespace relax_straggler::core::detect {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Labels with noise folded into one extra cluster; returns the number of clusters.
std::int32_t scoring_labels(const Labels& labels, Labels& out) {
  const std::int32_t k = count_clusters(labels);
  bool noise = false;
  out = labels;
  for (std::int32_t& l : out) {
    if (l == kNoise) {
      l = k;
      noise = true;
    }
  }
  return k + (noise ? 1 : 0);
}

double silhouette(const Weights& w, const Labels& labels, std::int32_t k, const Eigen::MatrixXd& d) {
  const Eigen::Index n = w.size();
  Eigen::VectorXd cluster_weight = Eigen::VectorXd::Zero(k);
  for (Eigen::Index i = 0; i < n; ++i) cluster_weight[labels[static_cast<std::size_t>(i)]] += w[i];
  // sums(c, i) = sum over j in cluster c of w_j * d(i, j): one pass over the matrix.
  Eigen::MatrixXd sums = Eigen::MatrixXd::Zero(k, n);
  for (Eigen::Index j = 0; j < n; ++j) {
    sums.row(labels[static_cast<std::size_t>(j)]) += w[j] * d.col(j).transpose();
  }
  double total = 0.0;
  double weight = 0.0;
  for (Eigen::Index i = 0; i < n; ++i) {
    const std::int32_t own = labels[static_cast<std::size_t>(i)];
    weight += w[i];
    if (cluster_weight[own] <= 1.0) continue;  // a singleton scores 0 (Rousseeuw's convention)
    const double a = sums(own, i) / (cluster_weight[own] - 1.0);
    double b = kInf;
    for (std::int32_t c = 0; c < k; ++c) {
      if (c != own && cluster_weight[c] > 0.0) b = std::min(b, sums(c, i) / cluster_weight[c]);
    }
    const double denom = std::max(a, b);
    if (denom > 0.0) total += w[i] * (b - a) / denom;
  }
  return total / weight;
}

}  // namespace

PartitionScore score_partition(const PointMatrix& x, const Weights& w, const Labels& labels,
                               const Eigen::MatrixXd& distances) {
  Labels lab;
  const std::int32_t k = scoring_labels(labels, lab);
  if (k < 2) return {kNaN, kNaN, kNaN};

  const Eigen::Index n = x.rows();
  const Eigen::Index dims = x.cols();
  Eigen::MatrixXd centroids = Eigen::MatrixXd::Zero(k, dims);
  Eigen::VectorXd cw = Eigen::VectorXd::Zero(k);
  for (Eigen::Index i = 0; i < n; ++i) {
    const auto c = lab[static_cast<std::size_t>(i)];
    centroids.row(c) += w[i] * x.row(i);
    cw[c] += w[i];
  }
  for (std::int32_t c = 0; c < k; ++c) centroids.row(c) /= cw[c];
  const double total_weight = cw.sum();
  const Eigen::RowVectorXd mean = (w.transpose() * x) / total_weight;

  double within = 0.0;
  Eigen::VectorXd spread = Eigen::VectorXd::Zero(k);  // weighted mean distance to the centroid
  for (Eigen::Index i = 0; i < n; ++i) {
    const auto c = lab[static_cast<std::size_t>(i)];
    const double sq = (x.row(i) - centroids.row(c)).squaredNorm();
    within += w[i] * sq;
    spread[c] += w[i] * std::sqrt(sq);
  }
  double between = 0.0;
  for (std::int32_t c = 0; c < k; ++c) {
    between += cw[c] * (centroids.row(c) - mean).squaredNorm();
    spread[c] /= cw[c];
  }

  PartitionScore s;
  s.silhouette = silhouette(w, lab, k, distances);
  s.calinski_harabasz = within == 0.0 ? (between > 0.0 ? kInf : kNaN)
                                      : (between / (k - 1)) / (within / (total_weight - k));
  double db = 0.0;
  for (std::int32_t c = 0; c < k; ++c) {
    double worst = 0.0;
    for (std::int32_t o = 0; o < k; ++o) {
      if (o == c) continue;
      const double sep = (centroids.row(c) - centroids.row(o)).norm();
      worst = std::max(worst, sep > 0.0 ? (spread[c] + spread[o]) / sep : kInf);
    }
    db += worst;
  }
  s.davies_bouldin = db / k;
  return s;
}

bool better_partition(const PartitionScore& a, const PartitionScore& b) {
  if (std::isnan(a.silhouette)) return false;
  if (std::isnan(b.silhouette)) return true;
  if (std::fabs(a.silhouette - b.silhouette) > 1e-9) return a.silhouette > b.silhouette;
  if (a.davies_bouldin != b.davies_bouldin) return a.davies_bouldin < b.davies_bouldin;
  return a.calinski_harabasz > b.calinski_harabasz;
}

}  // namespace relax_straggler::core::detect
