#include "core/detect/points.h"

#include <algorithm>
#include <cmath>
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

Eigen::MatrixXd k_distances(const Eigen::MatrixXd& distances, const Weights& w, const std::vector<double>& ks) {
  const Eigen::Index n = distances.rows();
  Eigen::MatrixXd out(n, static_cast<Eigen::Index>(ks.size()));
  if (n == 0 || ks.empty()) return out;
  // Weights are >= 1 in a coreset, but a caller may pass less: the k-th neighbour by
  // weight then lies beyond the k-th by count, so only order the prefix when that is safe.
  const double largest = *std::max_element(ks.begin(), ks.end());
  const bool unit_or_more = w.minCoeff() >= 1.0;
  const auto prefix = unit_or_more ? std::min<Eigen::Index>(n, static_cast<Eigen::Index>(std::ceil(largest))) : n;
  std::vector<std::pair<double, double>> column(static_cast<std::size_t>(n));  // (distance, weight)
  for (Eigen::Index i = 0; i < n; ++i) {
    for (Eigen::Index j = 0; j < n; ++j) column[static_cast<std::size_t>(j)] = {distances(j, i), w[j]};
    const auto end = column.begin() + prefix;
    if (prefix < n) std::nth_element(column.begin(), end - 1, column.end());
    std::sort(column.begin(), end);
    for (std::size_t q = 0; q < ks.size(); ++q) {
      double mass = 0.0;
      double found = (end - 1)->first;
      for (auto it = column.begin(); it != end; ++it) {
        mass += it->second;
        if (mass >= ks[q]) {
          found = it->first;
          break;
        }
      }
      out(i, static_cast<Eigen::Index>(q)) = found;
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
