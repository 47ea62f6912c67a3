#include "core/detect/slow_cluster.h"

#include <cmath>
#include <utility>
#include <stdexcept>

#include "core/detect/features.h"
#include "core/stats.h"

namespace relax_straggler::core::detect {

void SlowClusterOptions::validate() const {
  if (!(max_slow_fraction > 0.0 && max_slow_fraction < 1.0)) {
    throw std::invalid_argument("max_slow_fraction must be in (0, 1)");
  }
  if (!(min_slowdown >= 0.0) || !std::isfinite(min_slowdown)) {
    throw std::invalid_argument("min_slowdown must be a finite number >= 0");
  }
  if (!(link_min_z >= 0.0) || !std::isfinite(link_min_z)) {
    throw std::invalid_argument("link_min_z must be a finite number >= 0");
  }
}

namespace {

// Median and robust sigma (1.4826 MAD) of one feature over the ranks of group `g`.
std::pair<double, double> robust_location(const PointMatrix& features, int column, const std::vector<std::int32_t>& group,
                                          std::int32_t g) {
  std::vector<double> values, scratch;
  for (std::size_t i = 0; i < group.size(); ++i) {
    if (group[i] == g) values.push_back(features(static_cast<Eigen::Index>(i), column));
  }
  return {nan_median(values, scratch), 1.4826 * nan_mad(values, scratch)};
}

}  // namespace

std::vector<Flag> flag_ranks(const Labels& labels, const PointMatrix& features, StageKind kind,
                             const SlowClusterOptions& options) {
  const std::size_t n = labels.size();
  std::vector<Flag> flags(n, Flag::kNone);
  if (n == 0) return flags;
  // Groups: clusters 0..k-1, then one group per noise point.
  const std::int32_t k = count_clusters(labels);
  std::vector<std::int32_t> group(n);
  std::int32_t groups = k;
  for (std::size_t i = 0; i < n; ++i) group[i] = labels[i] == kNoise ? groups++ : labels[i];
  std::vector<double> size(static_cast<std::size_t>(groups), 0.0), sum(size), sum_min(size);
  for (std::size_t i = 0; i < n; ++i) {
    const auto g = static_cast<std::size_t>(group[i]);
    size[g] += 1.0;
    sum[g] += features(static_cast<Eigen::Index>(i), kMeanMs);
    sum_min[g] += features(static_cast<Eigen::Index>(i), kMinMs);
  }
  std::size_t main = 0;
  for (std::size_t g = 1; g < size.size(); ++g) {
    if (size[g] > size[main]) main = g;
  }
  const double main_mean = sum[main] / size[main];
  const double main_min = sum_min[main] / size[main];
  const double factor = 1.0 + options.min_slowdown;
  const double limit = options.max_slow_fraction * static_cast<double>(n);
  const bool comm = kind == StageKind::kCommunication;
  std::pair<double, double> body_mean{0.0, 0.0}, body_min{0.0, 0.0};
  if (comm) {
    body_mean = robust_location(features, kMeanMs, group, static_cast<std::int32_t>(main));
    body_min = robust_location(features, kMinMs, group, static_cast<std::int32_t>(main));
  }
  auto separated = [&](double value, const std::pair<double, double>& body) {
    return value - body.first >= options.link_min_z * body.second;
  };
  std::vector<Flag> group_flag(size.size(), Flag::kNone);
  for (std::size_t g = 0; g < size.size(); ++g) {
    if (g == main || size[g] == 0.0 || size[g] >= size[main] || size[g] > limit) continue;
    const double mean = sum[g] / size[g];
    const double floor = sum_min[g] / size[g];
    const bool link = floor >= main_min * factor && separated(mean, body_mean) && separated(floor, body_min);
    if (mean >= main_mean * factor && (!comm || link)) {
      group_flag[g] = Flag::kSlow;
    } else if (comm && mean * factor <= main_mean) {
      group_flag[g] = Flag::kLateArrival;
    }
  }
  for (std::size_t i = 0; i < n; ++i) flags[i] = group_flag[static_cast<std::size_t>(group[i])];
  return flags;
}

}  // namespace relax_straggler::core::detect
