#include "core/detect/voting.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace relax_straggler::core::detect {

void VoteOptions::validate() const {
  if (!(stage_fraction > 0.0 && stage_fraction <= 1.0)) throw std::invalid_argument("stage_vote_fraction must be in (0, 1]");
  if (min_votes < 1) throw std::invalid_argument("min_algorithm_votes must be >= 1");
}

VoteOutput tally(const VoteInput& input, const VoteOptions& options) {
  options.validate();
  const std::size_t ranks = input.ran_all.size();
  const double ran_kept = std::accumulate(input.kept_weight.begin(), input.kept_weight.end(), 0.0);
  VoteOutput out;
  out.votes.assign(ranks, 0);
  out.slow.assign(input.flags.size(), std::vector<std::uint8_t>(ranks, 0));
  for (std::size_t a = 0; a < input.flags.size(); ++a) {
    for (std::size_t k = 0; k < ranks; ++k) {
      double v = 0.0;
      for (std::size_t s = 0; s < input.flags[a].size(); ++s) {
        if (input.flags[a][s][k] != Flag::kNone) v += input.kept_weight[s];
      }
      const bool slow = v > 0.0 && v >= options.stage_fraction * ran_kept && v >= options.stage_fraction * input.ran_all[k];
      out.slow[a][k] = slow;
      out.votes[k] += slow ? 1 : 0;
    }
  }
  const std::int32_t top = out.votes.empty() ? 0 : *std::max_element(out.votes.begin(), out.votes.end());
  if (top < options.min_votes) return out;
  for (std::size_t k = 0; k < ranks; ++k) {
    const bool pick = options.rule == VoteRule::kMostVotes ? out.votes[k] == top : out.votes[k] >= options.min_votes;
    if (pick) out.anomalies.push_back(k);
  }
  return out;
}

}  // namespace relax_straggler::core::detect
