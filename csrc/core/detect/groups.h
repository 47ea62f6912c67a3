// Structural imbalance between groups of ranks that do different work by design (the
// stages of a pipeline: the first holds the embedding, the last the loss), and the
// per-group normalisation that keeps it from being read as individual stragglers.
//
// Ranks are comparable only with ranks of the same group. Per stage, the median of the
// per-rank mean time is taken within each group; a stage whose slowest group median
// exceeds the fastest by min_slowdown or more is reported as imbalanced. Then every
// rank's features are rescaled by (median over all ranks) / (its group's median), so
// the clusterers see each rank relative to its own group, in ms.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/detect/features.h"

namespace relax_straggler::core::detect {

struct StageImbalance {
  std::string stage;
  std::int32_t slowest_group = -1;
  std::int32_t fastest_group = -1;
  double ratio = 1.0;                // slowest / fastest group median of the per-rank mean, >= 1
  std::vector<double> group_mean_ms;  // per group id (0..max id), median of the per-rank mean; NaN for an empty group
};

// rank_to_group: one entry per window rank, ids >= 0. Modifies features.stages[*].raw in
// place and returns the imbalanced stages, worst ratio first. Throws std::invalid_argument
// when rank_to_group has the wrong length or a negative id.
std::vector<StageImbalance> normalise_by_group(WindowFeatures& features, const std::vector<std::string>& stage_names,
                                               const std::vector<std::int32_t>& rank_to_group,
                                               std::int32_t num_ranks, double min_slowdown);

}  // namespace relax_straggler::core::detect
