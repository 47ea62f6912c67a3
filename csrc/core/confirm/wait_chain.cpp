#include "core/confirm/wait_chain.h"

namespace relax_straggler::core::confirm {

Blame trace_wait(std::int32_t late, std::int32_t late_group, bool late_waited, const std::vector<SlowRank>& slow) {
  for (const SlowRank& s : slow) {
    if (s.rank == late) return Blame{s.rank, s.stage, false};
  }
  if (!late_waited) return Blame{};
  const SlowRank* best = nullptr;
  for (const SlowRank& s : slow) {
    if (s.group == late_group) continue;  // a p2p edge leads to another pipeline stage
    // A rank that did not wait itself is the root of the chain; prefer it.
    const bool better = best == nullptr || (best->waited && !s.waited) ||
                        (best->waited == s.waited && s.excess_ms > best->excess_ms);
    if (better) best = &s;
  }
  if (best == nullptr) return Blame{-1, -1, true};
  return Blame{best->rank, best->stage, true};
}

}  // namespace relax_straggler::core::confirm
