#include "core/attribute/late_arrival.h"

#include <algorithm>
#include <cmath>

#include "core/stats.h"

namespace relax_straggler::core::attribute {

void find_late_arrivals(const GridShape& shape, const std::vector<double>& collective_ms, std::size_t stages,
                        double budget_ms, const AttributionConfig& config, std::vector<double>& scratch,
                        std::vector<LateArrival>& out) {
  out.clear();
  if (shape.dp < 2 || stages == 0) return;
  const double floor_ms = std::max(config.absolute_ms_threshold, config.min_impact * budget_ms);
  std::vector<double> times;
  times.reserve(static_cast<std::size_t>(shape.dp));
  for (std::int32_t pp = 0; pp < shape.pp; ++pp) {
    for (std::size_t j = 0; j < stages; ++j) {
      times.clear();
      std::int32_t low_worker = -1;
      double low = 0.0;
      for (std::int32_t d = 0; d < shape.dp; ++d) {
        const std::int32_t w = shape.index(d, pp);
        const double t = collective_ms[static_cast<std::size_t>(w) * stages + j];
        if (!std::isfinite(t)) continue;
        times.push_back(t);
        if (low_worker < 0 || t < low) low_worker = w, low = t;
      }
      if (times.size() < 2) continue;
      const double ref = nan_median(Values(times), scratch);
      if (ref - low >= floor_ms && low * config.relative_threshold <= ref) {
        out.push_back({low_worker, static_cast<std::int32_t>(j), low, ref});
      }
    }
  }
}

}  // namespace relax_straggler::core::attribute
