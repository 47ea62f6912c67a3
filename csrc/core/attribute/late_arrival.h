// Collective late arrivals of a worker grid (docs/ARCHITECTURE.md invariant 7).
//
// In a data-parallel collective every replica waits until the last one arrives, so the
// replica that arrived last has the SHORTEST duration. Per pipeline stage and collective
// stage, with at least two dp replicas timed: the replica with the shortest time (the
// first on ties) is a late arrival when the others' median waited at least
//   ref - t >= max(absolute_ms_threshold, min_impact x budget_ms)  and  t x relative_threshold <= ref
// (ref: the median over the stage's replicas, t: the shortest time). The median, not the
// mean, because the waits of the other replicas are what the late one caused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/attribute/worker_grid.h"

namespace relax_straggler::core::attribute {

struct LateArrival {
  std::int32_t worker = -1;  // the replica that arrived last
  std::int32_t stage = -1;   // column of the collective stage
  double ms = 0.0;           // its time in the collective
  double ref_ms = 0.0;       // median over the stage's replicas
};

// collective_ms: workers x stages, worker-major, NaN = not run. budget_ms: the step budget
// of the impact rule (StepClassification::budget_ms). Appends to `out` (cleared first) in
// (pp rank, stage) order. Uses `scratch` to avoid allocating per call.
void find_late_arrivals(const GridShape& shape, const std::vector<double>& collective_ms, std::size_t stages,
                        double budget_ms, const AttributionConfig& config, std::vector<double>& scratch,
                        std::vector<LateArrival>& out);

}  // namespace relax_straggler::core::attribute
