// Votes: from per-stage flags of each algorithm to the window's anomaly ranks.
//
// Per algorithm a and analysed rank r, with stage weights w_j (default 1):
//     votes_a(r)  = sum of w_j over kept stages j where a flagged r (kSlow or kLateArrival)
//     ran_kept(r) = sum of w_j over kept stages (every analysed rank ran each of them)
//     ran_all(r)  = sum of w_j over all stages r ran in the window, before filtering
// a calls r slow when votes_a(r) > 0, votes_a(r) >= fraction x ran_kept(r) and
// votes_a(r) >= fraction x ran_all(r) (fraction = 0.5: "at least half the stages"). The
// second bound keeps a rank that is odd in one noisy stage, after the filters dropped
// the calm ones, from being called slow.
// Across algorithms: votes(r) = number of algorithms that call r slow. The anomaly ranks
// are those with the most votes (kMostVotes, mt-detector's max-vote rule) or those
// with at least min_votes (kAtLeast); none when the top count is below min_votes.
#pragma once

#include <cstdint>
#include <vector>

#include "core/detect/slow_cluster.h"

namespace relax_straggler::core::detect {

enum class VoteRule : std::uint8_t { kMostVotes = 0, kAtLeast = 1 };

struct VoteOptions {
  double stage_fraction = 0.5;     // (0, 1]
  std::int32_t min_votes = 3;      // algorithms, >= 1
  VoteRule rule = VoteRule::kMostVotes;

  void validate() const;  // throws std::invalid_argument naming the field
};

struct VoteInput {
  // flags[a][s][k]: algorithm a, kept stage s, analysed rank k.
  std::vector<std::vector<std::vector<Flag>>> flags;
  std::vector<double> kept_weight;  // per kept stage
  std::vector<double> ran_all;      // per analysed rank: weight of every stage it ran
};

struct VoteOutput {
  std::vector<std::vector<std::uint8_t>> slow;  // [a][k]: algorithm a calls analysed rank k slow
  std::vector<std::int32_t> votes;              // [k]: algorithms calling k slow
  std::vector<std::size_t> anomalies;           // analysed-rank indices, ascending
};

VoteOutput tally(const VoteInput& input, const VoteOptions& options);

}  // namespace relax_straggler::core::detect
