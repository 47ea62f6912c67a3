// Blame that follows the wait chain.
//
// A rank that arrives last at a collective (the shortest time there, docs/ARCHITECTURE.md invariant 7) made
// its peers wait, but it is the culprit only if nothing made it late in turn:
//   1. it is slow in a compute stage itself: the blame goes to that compute stage;
//   2. it waited on a pipeline peer (a long p2p send/recv time against its own group):
//      the blame goes, through the p2p edge, to the rank of another comparison group
//      (pipeline stage) that is slow in compute, the largest excess first; ranks that
//      themselves only waited are passed over, which follows chains of several hops
//      (stage 0 waits on stage 1, which waits on stage 2's slow rank);
//   3. neither: nobody is known to have caused it; the late rank itself is blamed with
//      an unknown cause (work outside the timed sections shows up only this way).
#pragma once

#include <cstdint>
#include <vector>

namespace relax_straggler::core::confirm {

// A rank with slow compute evidence this report.
struct SlowRank {
  std::int32_t rank = 0;
  std::int32_t group = 0;
  std::int32_t stage = -1;   // its compute stage with the largest excess
  double excess_ms = 0.0;    // that excess, ms
  bool waited = false;       // it also waited on a pipeline peer (long p2p time)
};

struct Blame {
  std::int32_t rank = -1;   // the culprit, -1 when none is known
  std::int32_t stage = -1;  // the culprit's compute stage
  bool waited = false;      // the late rank waited on a pipeline peer (never its fault)
};

// late: the late rank, late_group its comparison group, late_waited whether it waited on
// a pipeline peer. slow: this report's ranks with slow compute evidence (any order).
// Rule 3 is Blame{-1, -1, false}. O(slow.size()).
Blame trace_wait(std::int32_t late, std::int32_t late_group, bool late_waited, const std::vector<SlowRank>& slow);

}  // namespace relax_straggler::core::confirm
