// Which ranks a partition of one stage calls slow.
//
// The largest group is the main body of ranks. Every other group (a cluster, or a single
// DBSCAN noise point) that holds at most max_slow_fraction of the ranks is compared with
// it on the cluster averages of the per-rank window features (ms):
//   compute stage        group mean >= main mean x (1 + min_slowdown)   -> kSlow
//   communication stage  the same, and the same for the minimum         -> kSlow (a slow link)
//                        group mean x (1 + min_slowdown) <= main mean  -> kLateArrival
// A slow link lengthens every transfer, so it lifts the minimum too; time spent waiting
// for peers varies from step to step and lifts the mean of whoever waits, not the minimum.
// A slow link also rests on this one stage (no vote across stages backs it), so it must
// stand out from the body's own spread as well: mean and minimum at least link_min_z
// robust standard deviations (1.4826 MAD over the body's ranks) above the body's median.
// The late-arrival rule is docs/ARCHITECTURE.md invariant 7: collective durations include waiting for peers,
// so the rank that arrives last has the SHORTEST duration and is the one to blame. For a
// two-cluster partition this is "slow = the cluster with the highest mean" (lowest, for
// late arrival in communication), restricted to a minority that is materially slower.
#pragma once

#include <cstdint>
#include <vector>

#include "core/detect/points.h"
#include "core/step_matrix.h"

namespace relax_straggler::core::detect {

enum class Flag : std::uint8_t { kNone = 0, kSlow = 1, kLateArrival = 2 };

struct SlowClusterOptions {
  double max_slow_fraction = 0.5;  // a slow group is a minority, (0, 1)
  double min_slowdown = 0.03;      // relative gap to the main body, >= 0
  double link_min_z = 5.0;         // separation of a slow link from the body, robust sigmas, >= 0

  void validate() const;  // throws std::invalid_argument naming the field
};

// labels: one per rank (kNoise allowed); features: the raw ranks x kNumFeatures window
// features (features.h), same order.
std::vector<Flag> flag_ranks(const Labels& labels, const PointMatrix& features, StageKind kind,
                             const SlowClusterOptions& options);

}  // namespace relax_straggler::core::detect
