// Replay of the dependency model: each op starts when all its dependencies have ended; a
// sync group's members end their transfer part after the last member (on every dp_rank
// for dp-synced groups) has started. Steps replay independently from time 0 (the recorded
// steps are samples, not back to back), so a step's time is the latest end of its ops.
// The topological order is computed once (DependencyGraph::order); a replay is one linear
// pass over the flat duration array of each step.
#pragma once

#include <cstdint>
#include <vector>

#include "core/whatif/model.h"

namespace relax_straggler::core::whatif {

// Ops where workers[lane * pp + stage] and optypes[optype] are both set (an empty vector
// selects everything along that axis). none = true selects no op at all.
struct Selection {
  bool none = true;
  std::vector<std::uint8_t> workers;
  std::vector<std::uint8_t> optypes;

  static Selection nothing() { return {}; }
  bool selected(std::int32_t lane, std::int32_t stage, std::int32_t pp, std::int32_t optype) const {
    if (none) return false;
    if (!workers.empty() && !workers[static_cast<std::size_t>(lane) * pp + stage]) return false;
    return optypes.empty() || optypes[optype];
  }
};

// Which durations a replay uses: the base set everywhere, the other set on the selection.
struct ReplaySpec {
  bool base_recorded = true;
  Selection flip;
};

// Step times (s), one per model step. threads: 0 = all cores.
std::vector<double> replay_steps(const WhatIfModel& m, const ReplaySpec& spec, int threads = 0);

// Ideal everywhere except the ops of one dp lane (restricted to stages where stage_mask is
// set; empty = all) kept recorded. Exact with two lanes, the kept one and one ideal stand-in
// for all others, since with ideal durations every other lane runs the same timeline: the
// cost is two lanes, not dp, which makes per-dp_rank attribution linear instead of quadratic.
std::vector<double> replay_keep_lane(const WhatIfModel& m, std::int32_t lane, const std::vector<std::uint8_t>& stage_mask);

// Start and end (s, from the step's start) of every op instance, indexed like m.recorded.
void replay_timeline(const WhatIfModel& m, const ReplaySpec& spec, std::vector<double>* start, std::vector<double>* end);

}  // namespace relax_straggler::core::whatif
