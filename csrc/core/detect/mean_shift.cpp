#include "core/detect/mean_shift.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <stdexcept>

#include "core/detect/keep_best.h"
#include "core/detect/kmeans.h"
#include "core/detect/scores.h"

namespace relax_straggler::core::detect {
namespace {

PointMatrix grid_seeds(const PointMatrix& x, double cell) {
  std::map<std::vector<long long>, int> cells;
  std::vector<long long> key(static_cast<std::size_t>(x.cols()));
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index c = 0; c < x.cols(); ++c) key[static_cast<std::size_t>(c)] = std::llround(x(i, c) / cell);
    cells.emplace(key, 0);
  }
  PointMatrix seeds(static_cast<Eigen::Index>(cells.size()), x.cols());
  Eigen::Index r = 0;
  for (const auto& [k, unused] : cells) {
    (void)unused;
    for (Eigen::Index c = 0; c < x.cols(); ++c) seeds(r, c) = static_cast<double>(k[static_cast<std::size_t>(c)]) * cell;
    ++r;
  }
  return seeds;
}

}  // namespace

std::vector<double> estimate_bandwidths(const Eigen::MatrixXd& distances, const Weights& w,
                                        const std::vector<double>& quantiles) {
  std::vector<double> ks;
  for (double q : quantiles) {
    if (!(q > 0.0 && q <= 1.0)) throw std::invalid_argument("estimate_bandwidth: quantile must be in (0, 1]");
    ks.push_back(std::max(1.0, std::floor(q * w.sum())));
  }
  const Eigen::VectorXd mean = (w.transpose() * k_distances(distances, w, ks)).transpose() / w.sum();
  return std::vector<double>(mean.data(), mean.data() + mean.size());
}

MeanShiftResult mean_shift(const PointMatrix& x, const Weights& w, double bandwidth, bool bin_seeding,
                           std::int32_t max_iter) {
  if (!(bandwidth > 0.0)) throw std::invalid_argument("mean_shift: bandwidth must be > 0");
  if (max_iter < 1) throw std::invalid_argument("mean_shift: max_iter must be >= 1");
  const PointMatrix seeds = bin_seeding ? grid_seeds(x, bandwidth) : x;
  const double radius2 = bandwidth * bandwidth;

  std::vector<Eigen::RowVectorXd> found;
  std::vector<double> strength;
  for (Eigen::Index s = 0; s < seeds.rows(); ++s) {
    Eigen::RowVectorXd mean = seeds.row(s);
    for (std::int32_t it = 0; it < max_iter; ++it) {
      const Eigen::VectorXd d2 = (x.rowwise() - mean).rowwise().squaredNorm();
      Eigen::RowVectorXd sum = Eigen::RowVectorXd::Zero(x.cols());
      double mass = 0.0;
      for (Eigen::Index i = 0; i < x.rows(); ++i) {
        if (d2[i] > radius2) continue;
        sum += w[i] * x.row(i);
        mass += w[i];
      }
      if (mass == 0.0) break;  // an empty window: this seed finds no mode
      const Eigen::RowVectorXd next = sum / mass;
      const bool done = (next - mean).norm() <= 1e-3 * bandwidth || it + 1 == max_iter;
      mean = next;
      if (done) {
        found.push_back(mean);
        strength.push_back(mass);
        break;
      }
    }
  }

  // Strongest first; a mode within bandwidth of a kept stronger one is a duplicate.
  std::vector<std::size_t> order(found.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return strength[a] > strength[b]; });
  std::vector<Eigen::RowVectorXd> kept;
  for (std::size_t o : order) {
    const bool duplicate = std::any_of(kept.begin(), kept.end(), [&](const Eigen::RowVectorXd& k) {
      return (k - found[o]).squaredNorm() <= radius2;
    });
    if (!duplicate) kept.push_back(found[o]);
  }

  MeanShiftResult out;
  out.bandwidth = bandwidth;
  if (kept.empty()) kept.push_back((w.transpose() * x) / w.sum());
  out.modes.resize(static_cast<Eigen::Index>(kept.size()), x.cols());
  for (std::size_t k = 0; k < kept.size(); ++k) out.modes.row(static_cast<Eigen::Index>(k)) = kept[k];
  out.labels.resize(static_cast<std::size_t>(x.rows()));
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    Eigen::Index best = 0;
    (out.modes.rowwise() - x.row(i)).rowwise().squaredNorm().minCoeff(&best);
    out.labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(best);
  }
  return out;
}

MeanShiftResult mean_shift_auto(const PointMatrix& x, const Weights& w, const Eigen::MatrixXd& distances,
                                const MeanShiftOptions& options) {
  KeepBest<MeanShiftResult> best;
  for (double bandwidth : estimate_bandwidths(distances, w, options.quantiles)) {
    if (!(bandwidth > 0.0)) continue;  // coincident points: no scale to search at
    MeanShiftResult r = mean_shift(x, w, bandwidth, options.bin_seeding, options.max_iter);
    if (r.modes.rows() > 2) {
      // Merge the modes into two groups: a weighted 2-means over the modes, each mode
      // weighted by the points that joined it.
      Weights mode_weight = Weights::Zero(r.modes.rows());
      for (Eigen::Index i = 0; i < x.rows(); ++i) mode_weight[r.labels[static_cast<std::size_t>(i)]] += w[i];
      KMeansOptions km;
      km.k = 2;
      km.seed = options.seed;
      const KMeansResult groups = kmeans(r.modes, mode_weight, km);
      for (auto& l : r.labels) l = groups.labels[static_cast<std::size_t>(l)];
    }
    const PartitionScore score = score_partition(x, w, r.labels, distances);
    best.offer(std::move(r), score);
  }
  if (!best.has_value()) {  // no usable bandwidth: one cluster at the weighted mean
    MeanShiftResult one;
    one.labels.assign(static_cast<std::size_t>(x.rows()), 0);
    one.modes = (w.transpose() * x) / w.sum();
    return one;
  }
  return best.take();
}

}  // namespace relax_straggler::core::detect
