// Structural vs individual slowness of compute stages in one step.
//
// The dp replicas of one pipeline stage run the same layers on different data, so they
// are each other's reference; different pipeline stages run different layers, so stage
// against stage shows how the model was partitioned (What-if analysis, OSDI'25, separates
// these as M_W, individual workers, and M_S, stage imbalance).
//
//   individual (dp >= 2): t[d,p] >= rel x ref_p  and  t[d,p] - ref_p >= max(abs_ms, impact)
//       where ref_p = median over the dp replicas of stage p (with dp = 2, the other
//       replica: the median of two is their mean and would halve the slowdown);
//   structural (pp >= 2): ref_p >= rel x ref  and  ref_p - ref >= max(abs_ms, impact)
//       and every replica of p is >= rel x ref, where ref = median over stages of ref_p.
//   impact = min_impact x budget (step_ms, or the largest per-worker compute sum).
// With dp = 1 a stage slower than the others is reported as structural: with no replica
// to compare with, one slow device there is indistinguishable from an imbalanced partition.
#pragma once

#include <cstdint>
#include <vector>

#include "core/attribute/worker_grid.h"

namespace relax_straggler::core::attribute {

enum class SlowKind : std::uint8_t { kIndividual = 0, kStructural = 1 };

struct ComputeFlag {
  SlowKind kind = SlowKind::kIndividual;
  std::int32_t worker = -1;  // individual: the worker; structural: -1
  std::int32_t pp_rank = -1;
  std::int32_t stage = -1;   // compute stage column
  double ms = 0.0;           // individual: the worker's time; structural: ref_p
  double ref_ms = 0.0;       // individual: ref_p; structural: ref over stages
  double ratio() const { return ref_ms > 0.0 ? ms / ref_ms : 0.0; }
  double excess_ms() const { return ms - ref_ms; }
};

struct StepClassification {
  double budget_ms = 0.0;
  std::vector<ComputeFlag> flags;          // individual flags first, then structural
  std::vector<std::uint8_t> worker_slow;   // per worker: 1 if any flag covers it
  std::vector<double> peer_ref_ms;         // pp x stages: ref_p per stage, NaN if none
};

// Classifies one step. step.compute_ms must hold shape.workers() x num_stages values.
// Throws std::invalid_argument on a size mismatch.
StepClassification classify_step(const GridShape& shape, const WorkerStep& step, std::size_t num_stages,
                                 const AttributionConfig& config);

}  // namespace relax_straggler::core::attribute
