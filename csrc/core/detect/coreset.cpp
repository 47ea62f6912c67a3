#include "core/detect/coreset.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "core/detect/rng.h"

namespace relax_straggler::core::detect {

Coreset build_coreset(const PointMatrix& x, std::int32_t max_points, std::uint64_t seed) {
  if (max_points < 2) throw std::invalid_argument("max_points must be >= 2");
  const Eigen::Index n = x.rows();
  Coreset c;
  if (n <= max_points) {
    c.points = x;
    c.weights = Weights::Ones(n);
    c.representative.resize(static_cast<std::size_t>(n));
    std::iota(c.representative.begin(), c.representative.end(), 0);
    return c;
  }

  // The farthest half by squared distance from the (robust) centre.
  const Eigen::VectorXd far = x.rowwise().squaredNorm();
  std::vector<Eigen::Index> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), Eigen::Index{0});
  const auto extremes = static_cast<std::size_t>(max_points / 2);
  std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(extremes), order.end(),
                   [&](Eigen::Index a, Eigen::Index b) { return far[a] > far[b] || (far[a] == far[b] && a < b); });
  // The rest of the budget: a partial Fisher-Yates shuffle of the remaining rows.
  Rng rng(seed);
  const std::size_t sampled = static_cast<std::size_t>(max_points) - extremes;
  for (std::size_t i = 0; i < sampled; ++i) {
    const std::size_t pool = order.size() - extremes - i;
    std::swap(order[extremes + i], order[extremes + i + rng.below(pool)]);
  }
  order.resize(static_cast<std::size_t>(max_points));
  std::sort(order.begin(), order.end());  // representatives in input order: deterministic, cache-friendly

  c.points.resize(max_points, x.cols());
  for (Eigen::Index k = 0; k < max_points; ++k) c.points.row(k) = x.row(order[static_cast<std::size_t>(k)]);
  c.weights = Weights::Zero(max_points);
  c.representative.resize(static_cast<std::size_t>(n));

  // Nearest representative of every row, in blocks: argmin_k |r_k|^2 - 2 r_k.x, one
  // column per row so the argmin scans contiguous memory.
  const Eigen::VectorXd rep_norms = c.points.rowwise().squaredNorm();
  constexpr Eigen::Index kBlock = 1024;
  Eigen::MatrixXd scores;  // representatives x block rows
  for (Eigen::Index start = 0; start < n; start += kBlock) {
    const Eigen::Index rows = std::min(kBlock, n - start);
    scores.noalias() = -2.0 * c.points * x.middleRows(start, rows).transpose();
    scores.colwise() += rep_norms;
    for (Eigen::Index i = 0; i < rows; ++i) {
      Eigen::Index best = 0;
      scores.col(i).minCoeff(&best);
      c.representative[static_cast<std::size_t>(start + i)] = static_cast<std::int32_t>(best);
    }
  }
  // A representative always stands for itself (ties and rounding could send it elsewhere).
  for (Eigen::Index k = 0; k < max_points; ++k) {
    c.representative[static_cast<std::size_t>(order[static_cast<std::size_t>(k)])] = static_cast<std::int32_t>(k);
  }
  for (std::int32_t r : c.representative) c.weights[r] += 1.0;
  return c;
}

Labels expand_labels(const Coreset& coreset, const Labels& representative_labels) {
  Labels out(coreset.representative.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = representative_labels[static_cast<std::size_t>(coreset.representative[i])];
  }
  return out;
}

}  // namespace relax_straggler::core::detect
