// Per-step straggler verdict: the slow-rank rule (thresholds.h) applied to one sampled step.
//
// For each stage, ref = mean or median over the ranks that ran it (NaN-aware).
// Compute stages: rank r is a straggler if
//     t_r - ref >= noise_floor_ms  and  (t_r >= ref * relative_threshold  or  t_r - ref >= absolute_ms_threshold)
// Communication stages (docs/ARCHITECTURE.md invariant 7): durations include waiting for peers, so the rank
// that arrived last has the shortest duration. Rank r is a late arrival if
//     ref - t_r >= noise_floor_ms  and  (t_r * relative_threshold <= ref  or  ref - t_r >= absolute_ms_threshold)
// noise_floor_ms is added to the slow-rank rule: sub-millisecond stages (data loading,
// tiny optimizers) otherwise trip the relative rule on jitter alone. Setting it to 0 gives
// the bare rule.
//
// Comparison groups (our addition): ranks that do different work by design (the
// pipeline stages of a PP job: the first holds the embedding, the last the loss) are
// judged only against the ranks of their own group, and the spread between the groups'
// references is reported as structural imbalance instead of as stragglers.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/step_matrix.h"
#include "core/thresholds.h"

namespace relax_straggler::core {

enum class Reference : std::uint8_t { kMean = 0, kMedian = 1 };

struct VerdictConfig {
  double relative_threshold = kDefaultRelativeThreshold;    // dimensionless, >= 1
  double absolute_ms_threshold = kDefaultAbsoluteMsThreshold;  // ms, >= 0
  double noise_floor_ms = 1.0;         // ms, >= 0
  Reference reference = Reference::kMean;

  // Throws std::invalid_argument naming the offending field.
  void validate() const;
};

struct StageVerdict {
  std::string stage;
  StageKind kind = StageKind::kCompute;
  std::int32_t ranks_reporting = 0;  // ranks with a non-NaN time
  double ref_ms = 0.0;               // mean or median over ranks (NaN if none reported)
  double mean_ms = 0.0;
  double max_ms = 0.0;
  double min_ms = 0.0;
  // Compute: the slowest rank (argmax). Communication: the rank that arrived last
  // (argmin). Lowest rank index on ties; -1 if no rank reported.
  std::int32_t top_rank = -1;
  double slowdown_ratio = 0.0;  // max_ms / ref_ms
  // Score of top_rank in 0..1, lower is slower: min(1, ref/t) for compute,
  // min(1, t/ref) for communication (NVRx-style relative score).
  double relative_score = 0.0;
  // What the slowest rank costs: max - ref (compute), ref - min (communication).
  double excess_ms = 0.0;
  std::vector<std::int32_t> stragglers;  // ascending rank ids
  // Grouped verdicts, compute stages only: the largest group's work over the smallest's,
  // a group's work being the mean time of its ranks not flagged in the stage, since a
  // straggler is not imbalance (>= 1; NaN with fewer than two groups reporting; NaN for
  // communication stages, whose times between groups differ by waiting on each other, not
  // by work). ref/max/min/top_rank/slowdown/score/excess are then those of the group whose
  // top rank costs the most among the groups with stragglers (among all when none has
  // any); mean_ms is over all ranks.
  double imbalance_ratio = std::numeric_limits<double>::quiet_NaN();
};

struct StepVerdict {
  std::int64_t step = 0;
  std::vector<StageVerdict> stages;  // one per StepMatrix column, same order
  // Index into stages of the stage whose imbalance costs the most, or -1 when no
  // stage's excess reaches noise_floor_ms. See judge_step for the communication rule.
  std::int32_t likely_bottleneck = -1;
  std::string hints;  // one human-readable line
  std::int64_t unusable_cells = 0;  // the matrix's values that were no time (StepMatrix::unusable)

  std::int32_t num_stragglers() const;  // distinct straggler ranks over all stages
};

// Judges one sampled step. Complexity O(ranks x stages) (O(n) selection for the median).
// Throws std::invalid_argument on an invalid config or a malformed matrix.
StepVerdict judge_step(const StepMatrix& matrix, const VerdictConfig& config);

// Judges each rank against its comparison group only: groups[r] is rank r's group id
// (>= 0; for example its pipeline stage). Rank ids in the result are rows of `matrix`.
// One distinct id gives exactly judge_step(matrix, config). Complexity
// O(ranks x stages + ranks log ranks), whatever the number of groups.
// Throws std::invalid_argument when groups.size() != num_ranks or an id is negative.
StepVerdict judge_step(const StepMatrix& matrix, const VerdictConfig& config, const std::vector<std::int32_t>& groups);

}  // namespace relax_straggler::core
