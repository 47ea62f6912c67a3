// Who every rank waited for, collective by collective (docs/ARCHITECTURE.md invariant 7).
//
// The live report aligns the first collectives each rank issued on groups that span every
// analyzed rank (the same collectives, in issue order, when every rank reports the same
// number). In each, every rank waits until the last one arrives, so the rank with the
// SHORTEST duration arrived last (the first such rank on ties), and every other rank waited
// its duration minus that shortest one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace relax_straggler::core {

struct CollectiveWaits {
  std::vector<std::int64_t> late_counts;  // (ranks,) collectives in which the rank arrived last
  std::vector<double> wait_ms;            // (ranks,) summed waiting for the last arriver, ms
  std::int32_t blamed_rank = -1;          // the rank last in most collectives (lowest on ties)
};

// durations_ms: ranks x collectives, rank-major, finite (the caller passes only ranks that
// reported these collectives). Throws std::invalid_argument when ranks < 2, collectives < 1,
// the size does not match or a duration is not finite.
CollectiveWaits collective_waits(const double* durations_ms, std::size_t ranks, std::size_t collectives);

}  // namespace relax_straggler::core
