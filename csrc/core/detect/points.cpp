#include "core/detect/points.h"

#include <algorithm>
#include <utility>
#include <unordered_map>

namespace relax_straggler::core::detect {

Eigen::MatrixXd pairwise_distances(const PointMatrix& x) {
  const Eigen::VectorXd norms = x.rowwise().squaredNorm();
  Eigen::MatrixXd d = -2.0 * (x * x.transpose());
  d.colwise() += norms;
  d.rowwise() += norms.transpose();
  d = d.cwiseMax(0.0).cwiseSqrt();
  d.diagonal().setZero();
  return d;
}

Eigen::RowVectorXd cluster_centroid(const PointMatrix& x, const Weights& w, const Labels& labels, std::int32_t label) {
  Eigen::RowVectorXd sum = Eigen::RowVectorXd::Zero(x.cols());
  double total = 0.0;
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    if (labels[static_cast<std::size_t>(i)] != label) continue;
    sum += w[i] * x.row(i);
    total += w[i];
  }
  return total > 0.0 ? Eigen::RowVectorXd(sum / total) : sum;
}

Eigen::VectorXd k_distances(const Eigen::MatrixXd& distances, const Weights& w, double k) {
  const Eigen::Index n = distances.rows();
  Eigen::VectorXd out(n);
  std::vector<std::pair<double, double>> column(static_cast<std::size_t>(n));  // (distance, weight)
  for (Eigen::Index i = 0; i < n; ++i) {
    for (Eigen::Index j = 0; j < n; ++j) column[static_cast<std::size_t>(j)] = {distances(j, i), w[j]};
    std::sort(column.begin(), column.end());
    double mass = 0.0;
    out[i] = column.back().first;
    for (const auto& [d, weight] : column) {
      mass += weight;
      if (mass >= k) {
        out[i] = d;
        break;
      }
    }
  }
  return out;
}

std::int32_t count_clusters(const Labels& labels) {
  std::int32_t k = 0;
  for (std::int32_t l : labels) k = std::max(k, l + 1);
  return k;
}

std::int32_t compact_labels(Labels& labels) {
  std::unordered_map<std::int32_t, std::int32_t> remap;
  for (std::int32_t& l : labels) {
    if (l == kNoise) continue;
    auto it = remap.emplace(l, static_cast<std::int32_t>(remap.size())).first;
    l = it->second;
  }
  return static_cast<std::int32_t>(remap.size());
}

}  // namespace relax_straggler::core::detect
