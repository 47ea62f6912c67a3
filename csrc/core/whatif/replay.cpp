#include "core/whatif/replay.h"

#include <algorithm>
#include <limits>

#include "core/whatif/parallel.h"

namespace relax_straggler::core::whatif {
namespace {

// lanes[i]: the model lane simulated as lane i, or -1 for an ideal stand-in lane.
// keep(lane, stage, optype) -> use the recorded duration. Writes end times into `end`
// ([slot][i]) and, when `start` is given, start times; returns the step time.
template <typename Keep>
double replay_step(const WhatIfModel& m, std::int32_t step, const std::vector<std::int32_t>& lanes, Keep keep,
                   std::vector<double>& end, std::vector<double>* start) {
  const DependencyGraph& g = m.graph;
  const std::size_t nl = lanes.size();
  end.assign(static_cast<std::size_t>(g.slots()) * nl, 0.0);
  if (start) start->assign(end.size(), 0.0);
  std::vector<double> ready;  // per member x lane: when its dependencies are done
  double step_end = 0.0;
  auto duration = [&](std::int32_t slot, std::size_t i) {
    const std::int32_t lane = lanes[i];
    const std::int32_t t = g.slot_optype[slot];
    if (lane >= 0 && keep(lane, g.slot_stage[slot], t)) return static_cast<double>(m.recorded[m.index(step, slot, lane)]);
    return m.ideal[t];
  };
  auto deps_done = [&](std::int32_t slot, std::size_t i) {
    double t = 0.0;
    for (std::int32_t k = g.dep_begin[slot]; k < g.dep_begin[slot + 1]; ++k) t = std::max(t, end[g.deps[k] * nl + i]);
    return t;
  };
  for (std::int32_t gi : g.order) {
    const SyncGroup& grp = g.groups[gi];
    if (!grp.sync) {
      const std::int32_t slot = grp.members[0];
      for (std::size_t i = 0; i < nl; ++i) {
        const double s = deps_done(slot, i);
        if (start) (*start)[slot * nl + i] = s;
        end[slot * nl + i] = s + duration(slot, i);
      }
      continue;
    }
    const std::size_t nm = grp.members.size();
    ready.resize(nm * nl);
    for (std::size_t a = 0; a < nm; ++a) {
      for (std::size_t i = 0; i < nl; ++i) ready[a * nl + i] = deps_done(grp.members[a], i);
    }
    double all_latest = 0.0;
    if (grp.dp_synced) all_latest = *std::max_element(ready.begin(), ready.end());
    for (std::size_t i = 0; i < nl; ++i) {
      double latest = all_latest;
      if (!grp.dp_synced) {
        for (std::size_t a = 0; a < nm; ++a) latest = std::max(latest, ready[a * nl + i]);
      }
      for (std::size_t a = 0; a < nm; ++a) {
        const std::int32_t slot = grp.members[a];
        if (start) (*start)[slot * nl + i] = ready[a * nl + i];
        end[slot * nl + i] = latest + duration(slot, i);
      }
    }
  }
  for (double e : end) step_end = std::max(step_end, e);
  return step_end;
}

std::vector<std::int32_t> all_lanes(const WhatIfModel& m) {
  std::vector<std::int32_t> lanes(m.dp);
  for (std::int32_t l = 0; l < m.dp; ++l) lanes[l] = l;
  return lanes;
}

}  // namespace

std::vector<double> replay_steps(const WhatIfModel& m, const ReplaySpec& spec, int threads) {
  std::vector<double> out(m.num_steps());
  const auto lanes = all_lanes(m);
  const std::int32_t pp = m.pp();
  parallel_for(m.num_steps(), threads, [&](std::int64_t st) {
    std::vector<double> end;
    out[st] = replay_step(m, static_cast<std::int32_t>(st), lanes,
                          [&](std::int32_t lane, std::int32_t stage, std::int32_t t) {
                            return spec.flip.selected(lane, stage, pp, t) != spec.base_recorded;
                          },
                          end, nullptr);
  });
  return out;
}

std::vector<double> replay_keep_lane(const WhatIfModel& m, std::int32_t lane, const std::vector<std::uint8_t>& stage_mask) {
  std::vector<std::int32_t> lanes = {lane};
  if (m.dp > 1) lanes.push_back(-1);
  std::vector<double> out(m.num_steps());
  std::vector<double> end;
  for (std::int32_t st = 0; st < m.num_steps(); ++st) {
    out[st] = replay_step(m, st, lanes,
                          [&](std::int32_t, std::int32_t stage, std::int32_t) {
                            return stage_mask.empty() || stage_mask[stage];
                          },
                          end, nullptr);
  }
  return out;
}

void replay_timeline(const WhatIfModel& m, const ReplaySpec& spec, std::vector<double>* start, std::vector<double>* end) {
  start->resize(m.recorded.size());
  end->resize(m.recorded.size());
  const auto lanes = all_lanes(m);
  const std::int32_t pp = m.pp();
  const std::size_t per_step = static_cast<std::size_t>(m.graph.slots()) * m.dp;
  parallel_for(m.num_steps(), 0, [&](std::int64_t st) {
    std::vector<double> e, s;
    replay_step(m, static_cast<std::int32_t>(st), lanes,
                [&](std::int32_t lane, std::int32_t stage, std::int32_t t) {
                  return spec.flip.selected(lane, stage, pp, t) != spec.base_recorded;
                },
                e, &s);
    std::copy(s.begin(), s.end(), start->begin() + st * per_step);
    std::copy(e.begin(), e.end(), end->begin() + st * per_step);
  });
}

}  // namespace relax_straggler::core::whatif
