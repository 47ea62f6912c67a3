// The what-if analyses of the OSDI'25 straggler study (Sec. 4): slowdown S (Eq. 1), its
// attribution S_i to each dp_rank, stage, op type group and worker (Eq. 2/4), and how much
// of it fixing a set of ops gives back (rem/add; M_W Eq. 5, M_S).
#pragma once

#include <cstdint>
#include <vector>

#include "core/whatif/model.h"
#include "core/whatif/replay.h"

namespace relax_straggler::core::whatif {

// Fixing a set: t_rem = recorded with the set ideal, t_add = ideal with the set recorded
// (mean step times, s); rem = (t_ori - t_rem) / (t_ori - t_ideal), add = (t_add - t_ideal) /
// (t_ori - t_ideal). NaN when t_ori == t_ideal (nothing to give back).
struct GiveBack {
  double t_ori = 0, t_ideal = 0, t_rem = 0, t_add = 0, rem = 0, add = 0;
};

struct WhatIfOptions {
  std::vector<std::int32_t> optype_group;  // per op type: its attribution group (empty: one per type)
  double top_fraction = 0.03;              // M_W: this fraction of workers (at least one)
  bool by_worker = true;                   // per-worker attribution (2 lanes x dp x pp replays)
  int threads = 0;                         // 0 = all cores
};

struct WhatIfResult {
  std::vector<double> measured_step_s, replayed_step_s, ideal_step_s;  // per step
  double slowdown = 1.0;                                               // S = mean(replayed) / mean(ideal)
  std::vector<double> slowdown_per_step;
  double simulation_error = 1.0;  // mean(measured) / mean(replayed)
  // S_i overall and [i][step].
  std::vector<double> by_dp, by_stage, by_group, by_worker;  // by_worker[lane * pp + stage]; empty if not asked
  std::vector<std::vector<double>> by_dp_per_step, by_stage_per_step, by_group_per_step;
  std::vector<std::int32_t> top_workers;  // lane * pp + stage, by score min(S_dp, S_stage), best first
  GiveBack m_w, m_s;
};

double mean(const std::vector<double>& v);

// Runs every analysis. Throws std::invalid_argument if optype_group has the wrong size.
WhatIfResult analyze(const WhatIfModel& m, const WhatIfOptions& opts);

// rem/add for an arbitrary selection, given the mean replayed and ideal step times.
GiveBack give_back(const WhatIfModel& m, const Selection& sel, double t_ori, double t_ideal, int threads = 0);

}  // namespace relax_straggler::core::whatif
