#include "core/whatif/analysis.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "core/whatif/parallel.h"

namespace relax_straggler::core::whatif {
namespace {

void ratios(const std::vector<double>& keep, const std::vector<double>& ideal, double* overall,
            std::vector<double>* per_step) {
  *overall = mean(keep) / mean(ideal);
  per_step->resize(keep.size());
  for (std::size_t i = 0; i < keep.size(); ++i) (*per_step)[i] = keep[i] / ideal[i];
}

}  // namespace

double mean(const std::vector<double>& v) {
  return v.empty() ? std::numeric_limits<double>::quiet_NaN() : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

GiveBack give_back(const WhatIfModel& m, const Selection& sel, double t_ori, double t_ideal, int threads) {
  GiveBack r;
  r.t_ori = t_ori;
  r.t_ideal = t_ideal;
  r.t_rem = mean(replay_steps(m, {true, sel}, threads));
  r.t_add = mean(replay_steps(m, {false, sel}, threads));
  const double lost = t_ori - t_ideal;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  r.rem = lost != 0 ? (t_ori - r.t_rem) / lost : nan;
  r.add = lost != 0 ? (r.t_add - t_ideal) / lost : nan;
  return r;
}

WhatIfResult analyze(const WhatIfModel& m, const WhatIfOptions& opts) {
  const std::size_t nt = m.optype_roles.size();
  std::vector<std::int32_t> group = opts.optype_group;
  if (group.empty()) {
    group.resize(nt);
    std::iota(group.begin(), group.end(), 0);
  }
  if (group.size() != nt) {
    throw std::invalid_argument("optype_group has " + std::to_string(group.size()) + " entries for " +
                                std::to_string(nt) + " op types");
  }
  const std::int32_t ngroups = *std::max_element(group.begin(), group.end()) + 1;
  const std::int32_t pp = m.pp(), dp = m.dp;
  const int th = opts.threads;

  WhatIfResult r;
  r.measured_step_s = m.measured_step_s;
  r.replayed_step_s = replay_steps(m, {true, Selection::nothing()}, th);
  r.ideal_step_s = replay_steps(m, {false, Selection::nothing()}, th);
  ratios(r.replayed_step_s, r.ideal_step_s, &r.slowdown, &r.slowdown_per_step);
  r.simulation_error = mean(r.measured_step_s) / mean(r.replayed_step_s);

  // Per dp_rank: two-lane replays, independent, so one per thread.
  std::vector<std::vector<double>> keep_dp(dp);
  parallel_for(dp, th, [&](std::int64_t l) { keep_dp[l] = replay_keep_lane(m, static_cast<std::int32_t>(l), {}); });
  r.by_dp.resize(dp);
  r.by_dp_per_step.resize(dp);
  for (std::int32_t l = 0; l < dp; ++l) ratios(keep_dp[l], r.ideal_step_s, &r.by_dp[l], &r.by_dp_per_step[l]);

  r.by_stage.resize(pp);
  r.by_stage_per_step.resize(pp);
  for (std::int32_t s = 0; s < pp; ++s) {
    Selection sel{false, std::vector<std::uint8_t>(static_cast<std::size_t>(dp) * pp, 0), {}};
    for (std::int32_t l = 0; l < dp; ++l) sel.workers[static_cast<std::size_t>(l) * pp + s] = 1;
    ratios(replay_steps(m, {false, sel}, th), r.ideal_step_s, &r.by_stage[s], &r.by_stage_per_step[s]);
  }

  r.by_group.assign(ngroups, std::numeric_limits<double>::quiet_NaN());
  r.by_group_per_step.resize(ngroups);
  for (std::int32_t gid = 0; gid < ngroups; ++gid) {
    Selection sel{false, {}, std::vector<std::uint8_t>(nt, 0)};
    bool any = false;
    for (std::size_t t = 0; t < nt; ++t) {
      if (group[t] == gid) sel.optypes[t] = 1, any = true;
    }
    if (any) ratios(replay_steps(m, {false, sel}, th), r.ideal_step_s, &r.by_group[gid], &r.by_group_per_step[gid]);
  }

  if (opts.by_worker) {
    r.by_worker.resize(static_cast<std::size_t>(dp) * pp);
    parallel_for(static_cast<std::int64_t>(dp) * pp, th, [&](std::int64_t w) {
      std::vector<std::uint8_t> mask(pp, 0);
      mask[w % pp] = 1;
      r.by_worker[w] = mean(replay_keep_lane(m, static_cast<std::int32_t>(w / pp), mask)) / mean(r.ideal_step_s);
    });
  }

  // M_W: the top workers by min(S_dp, S_stage), ties to the lower stage, then dp lane.
  std::vector<std::int32_t> workers(static_cast<std::size_t>(dp) * pp);
  std::iota(workers.begin(), workers.end(), 0);
  auto score = [&](std::int32_t w) { return std::min(r.by_dp[w / pp], r.by_stage[w % pp]); };
  std::stable_sort(workers.begin(), workers.end(), [&](std::int32_t a, std::int32_t b) {
    if (score(a) != score(b)) return score(a) > score(b);
    return a % pp != b % pp ? a % pp < b % pp : a / pp < b / pp;
  });
  const auto n_top = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(workers.size() * opts.top_fraction - 1e-9)));
  r.top_workers.assign(workers.begin(), workers.begin() + std::min(n_top, workers.size()));
  const double t_ori = mean(r.replayed_step_s), t_ideal = mean(r.ideal_step_s);
  Selection top{false, std::vector<std::uint8_t>(workers.size(), 0), {}};
  for (std::int32_t w : r.top_workers) top.workers[w] = 1;
  r.m_w = give_back(m, top, t_ori, t_ideal, th);
  Selection last{false, std::vector<std::uint8_t>(workers.size(), 0), {}};
  for (std::int32_t l = 0; l < dp; ++l) last.workers[static_cast<std::size_t>(l) * pp + pp - 1] = 1;
  r.m_s = give_back(m, last, t_ori, t_ideal, th);
  return r;
}

}  // namespace relax_straggler::core::whatif
