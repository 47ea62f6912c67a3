#include "core/detect/dbscan.h"

#include <algorithm>
#include <stdexcept>

#include "core/detect/keep_best.h"
#include "core/detect/scores.h"

namespace relax_straggler::core::detect {

Labels dbscan(const Eigen::MatrixXd& distances, const Weights& w, double eps, double min_samples) {
  if (!(eps >= 0.0)) throw std::invalid_argument("dbscan: eps must be >= 0");
  if (!(min_samples > 0.0)) throw std::invalid_argument("dbscan: min_samples must be > 0");
  const Eigen::Index n = distances.rows();
  std::vector<char> core(static_cast<std::size_t>(n), 0);
  for (Eigen::Index i = 0; i < n; ++i) {
    double mass = 0.0;
    for (Eigen::Index j = 0; j < n; ++j) {
      if (distances(j, i) <= eps) mass += w[j];
    }
    core[static_cast<std::size_t>(i)] = mass >= min_samples;
  }
  Labels labels(static_cast<std::size_t>(n), kNoise);
  std::vector<Eigen::Index> frontier;
  std::int32_t next = 0;
  for (Eigen::Index seed = 0; seed < n; ++seed) {
    if (!core[static_cast<std::size_t>(seed)] || labels[static_cast<std::size_t>(seed)] != kNoise) continue;
    labels[static_cast<std::size_t>(seed)] = next;
    frontier.assign(1, seed);
    while (!frontier.empty()) {
      const Eigen::Index i = frontier.back();
      frontier.pop_back();
      for (Eigen::Index j = 0; j < n; ++j) {
        if (distances(j, i) > eps || labels[static_cast<std::size_t>(j)] != kNoise) continue;
        labels[static_cast<std::size_t>(j)] = next;  // border points join the first cluster that reaches them
        if (core[static_cast<std::size_t>(j)]) frontier.push_back(j);
      }
    }
    ++next;
  }
  return labels;
}

double knee_eps(const Eigen::VectorXd& k_distances) {
  std::vector<double> y(k_distances.data(), k_distances.data() + k_distances.size());
  std::sort(y.begin(), y.end());
  const double lo = y.front();
  const double hi = y.back();
  if (y.size() < 3 || hi <= lo) return hi;
  std::size_t knee = 0;
  double farthest = -1.0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double below = static_cast<double>(i) / static_cast<double>(y.size() - 1) - (y[i] - lo) / (hi - lo);
    if (below > farthest) {
      farthest = below;
      knee = i;
    }
  }
  if (y[knee] > 0.0) return y[knee];
  const auto positive = std::upper_bound(y.begin(), y.end(), 0.0);
  return positive == y.end() ? hi : *positive;
}

DbscanResult dbscan_auto(const PointMatrix& x, const Weights& w, const Eigen::MatrixXd& distances,
                         const DbscanOptions& options) {
  const double min_samples = std::max(1.0, std::min(options.min_samples, 0.5 * w.sum()));
  const double knee = knee_eps(k_distances(distances, w, {min_samples}).col(0));
  KeepBest<DbscanResult> best;
  for (double scale : options.eps_scales) {
    const double eps = knee * scale;
    Labels labels = dbscan(distances, w, eps, min_samples);
    const PartitionScore score = score_partition(x, w, labels, distances);
    best.offer({std::move(labels), eps}, score);
  }
  return best.take();
}

}  // namespace relax_straggler::core::detect
