#include "core/detect/groups.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "core/stats.h"

namespace relax_straggler::core::detect {

std::vector<StageImbalance> normalise_by_group(WindowFeatures& features, const std::vector<std::string>& stage_names,
                                               const std::vector<std::int32_t>& rank_to_group,
                                               std::int32_t num_ranks, double min_slowdown) {
  if (rank_to_group.size() != static_cast<std::size_t>(num_ranks)) {
    throw std::invalid_argument("rank_to_group has " + std::to_string(rank_to_group.size()) +
                                " entries, expected one per rank (" + std::to_string(num_ranks) + ")");
  }
  std::int32_t groups = 0;
  for (std::int32_t g : rank_to_group) {
    if (g < 0) throw std::invalid_argument("rank_to_group ids must be >= 0, got " + std::to_string(g));
    groups = std::max(groups, g + 1);
  }
  std::vector<StageImbalance> out;
  std::vector<std::vector<double>> members(static_cast<std::size_t>(groups));
  std::vector<double> scratch, all;
  for (StageFeatures& sf : features.stages) {
    for (auto& m : members) m.clear();
    all.clear();
    for (std::size_t k = 0; k < features.ranks.size(); ++k) {
      const double mean = sf.raw(static_cast<Eigen::Index>(k), kMeanMs);
      members[static_cast<std::size_t>(rank_to_group[static_cast<std::size_t>(features.ranks[k])])].push_back(mean);
      all.push_back(mean);
    }
    StageImbalance imb;
    imb.stage = stage_names[sf.column];
    imb.group_mean_ms.assign(static_cast<std::size_t>(groups), std::numeric_limits<double>::quiet_NaN());
    double lo = std::numeric_limits<double>::infinity();
    double hi = -lo;
    for (std::int32_t g = 0; g < groups; ++g) {
      const auto& m = members[static_cast<std::size_t>(g)];
      if (m.empty()) continue;
      const double med = nan_median(m, scratch);
      imb.group_mean_ms[static_cast<std::size_t>(g)] = med;
      if (med > hi) {
        hi = med;
        imb.slowest_group = g;
      }
      if (med < lo) {
        lo = med;
        imb.fastest_group = g;
      }
    }
    imb.ratio = hi / lo;
    const double overall = nan_median(all, scratch);
    for (std::size_t k = 0; k < features.ranks.size(); ++k) {
      const double med =
          imb.group_mean_ms[static_cast<std::size_t>(rank_to_group[static_cast<std::size_t>(features.ranks[k])])];
      sf.raw.row(static_cast<Eigen::Index>(k)) *= overall / med;
    }
    if (imb.ratio >= 1.0 + min_slowdown) out.push_back(std::move(imb));
  }
  std::stable_sort(out.begin(), out.end(), [](const StageImbalance& a, const StageImbalance& b) { return a.ratio > b.ratio; });
  return out;
}

}  // namespace relax_straggler::core::detect
