#include "core/attribute/classify.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/stats.h"

namespace relax_straggler::core::attribute {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The largest per-worker sum of compute time: what the step cannot be shorter than.
double compute_budget_ms(const WorkerStep& step, std::int32_t workers, std::size_t stages) {
  double best = 0.0;
  for (std::int32_t w = 0; w < workers; ++w) {
    double sum = 0.0;
    for (std::size_t s = 0; s < stages; ++s) {
      const double t = step.compute_ms[static_cast<std::size_t>(w) * stages + s];
      if (std::isfinite(t)) sum += t;
    }
    best = std::max(best, sum);
  }
  return best;
}

bool slower(double t, double ref, double min_excess_ms, const AttributionConfig& c) {
  return std::isfinite(t) && std::isfinite(ref) && t >= ref * c.relative_threshold && t - ref >= min_excess_ms;
}

}  // namespace

StepClassification classify_step(const GridShape& shape, const WorkerStep& step, std::size_t num_stages,
                                 const AttributionConfig& config) {
  const std::int32_t workers = shape.workers();
  if (step.compute_ms.size() != static_cast<std::size_t>(workers) * num_stages) {
    throw std::invalid_argument("step " + std::to_string(step.step) + ": compute_ms has " +
                                std::to_string(step.compute_ms.size()) + " values, expected workers (" +
                                std::to_string(workers) + ") x stages (" + std::to_string(num_stages) + ")");
  }
  StepClassification out;
  out.budget_ms = std::isfinite(step.step_ms) && step.step_ms > 0.0 ? step.step_ms
                                                                     : compute_budget_ms(step, workers, num_stages);
  const double min_excess_ms = std::max(config.absolute_ms_threshold, config.min_impact * out.budget_ms);
  out.worker_slow.assign(static_cast<std::size_t>(workers), 0);
  out.peer_ref_ms.assign(static_cast<std::size_t>(shape.pp) * num_stages, kNaN);

  const auto at = [&](std::int32_t d, std::int32_t p, std::size_t s) {
    return step.compute_ms[static_cast<std::size_t>(shape.index(d, p)) * num_stages + s];
  };
  std::vector<double> column, scratch;
  std::vector<ComputeFlag> structural;
  for (std::size_t s = 0; s < num_stages; ++s) {
    for (std::int32_t p = 0; p < shape.pp; ++p) {
      column.clear();
      for (std::int32_t d = 0; d < shape.dp; ++d) column.push_back(at(d, p, s));
      const double ref_p = nan_median(Values(column), scratch);
      out.peer_ref_ms[static_cast<std::size_t>(p) * num_stages + s] = ref_p;
      if (shape.dp < 2) continue;
      for (std::int32_t d = 0; d < shape.dp; ++d) {
        const double t = at(d, p, s);
        // With two replicas the median of both is their mean, which halves the apparent
        // slowdown: compare with the other replica instead.
        const double ref_d = shape.dp == 2 ? at(1 - d, p, s) : ref_p;
        if (!slower(t, ref_d, min_excess_ms, config)) continue;
        const std::int32_t w = shape.index(d, p);
        out.flags.push_back({SlowKind::kIndividual, w, p, static_cast<std::int32_t>(s), t, ref_d});
        out.worker_slow[static_cast<std::size_t>(w)] = 1;
      }
    }
    if (shape.pp < 2) continue;
    column.clear();
    for (std::int32_t p = 0; p < shape.pp; ++p) {
      column.push_back(out.peer_ref_ms[static_cast<std::size_t>(p) * num_stages + s]);
    }
    const double ref = nan_median(Values(column), scratch);
    for (std::int32_t p = 0; p < shape.pp; ++p) {
      const double ref_p = column[static_cast<std::size_t>(p)];
      if (!slower(ref_p, ref, min_excess_ms, config)) continue;
      bool every_replica = true;
      for (std::int32_t d = 0; d < shape.dp && every_replica; ++d) {
        every_replica = slower(at(d, p, s), ref, 0.0, config);
      }
      if (!every_replica) continue;
      structural.push_back({SlowKind::kStructural, -1, p, static_cast<std::int32_t>(s), ref_p, ref});
      for (std::int32_t d = 0; d < shape.dp; ++d) out.worker_slow[static_cast<std::size_t>(shape.index(d, p))] = 1;
    }
  }
  out.flags.insert(out.flags.end(), structural.begin(), structural.end());
  return out;
}

}  // namespace relax_straggler::core::attribute
