#include "core/confirm/tracker.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/confirm/simd.h"
#include "core/stats.h"

namespace relax_straggler::core::confirm {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMadToSigma = 1.4826;  // MAD of a normal distribution x 1.4826 = its sigma

}  // namespace

ConfirmTracker::ConfirmTracker(ConfirmConfig config) : cfg_(std::move(config)) { cfg_.validate(); }

void ConfirmTracker::reset() {
  reports_ = 0;
  released_.clear();
  ranks_ = groups_n_ = 0;
  stages_.clear();
  group_.clear();
  entries_.clear();
  window_ = WindowEvidence{};
  window_rank_.clear();
}

void ConfirmTracker::layout(const StepMatrix& m, const std::vector<std::int32_t>& groups) {
  const std::size_t S = m.num_stages();
  std::int32_t max_id = 0;
  for (std::size_t r = 0; r < groups.size(); ++r) max_id = std::max(max_id, groups[r]);
  groups_n_ = max_id + 1;
  ranks_ = m.num_ranks;
  stages_ = m.stages;
  group_ = groups.empty() ? std::vector<std::int32_t>(static_cast<std::size_t>(ranks_), 0) : groups;
  roles_.assign(S, Role::kCompute);
  scaled_.assign(S, 0);
  data_stage_ = union_stage_ = -1;
  for (std::size_t s = 0; s < S; ++s) {
    const std::string& name = m.stages[s];
    if (name == "communication") union_stage_ = static_cast<std::int32_t>(s);
    if (m.kinds[s] == StageKind::kCommunication) {
      const bool p2p = std::find(cfg_.p2p_stages.begin(), cfg_.p2p_stages.end(), name) != cfg_.p2p_stages.end();
      roles_[s] = p2p ? Role::kP2p : Role::kCollective;
    } else {
      scaled_[s] = std::find(cfg_.workload_stages.begin(), cfg_.workload_stages.end(), name) !=
                   cfg_.workload_stages.end();
      if (name == cfg_.data_stage) data_stage_ = static_cast<std::int32_t>(s);
    }
  }
  // Rows bucketed by group once per run (counting sort): each group is one contiguous run.
  group_start_.assign(static_cast<std::size_t>(groups_n_) + 1, 0);
  for (std::int32_t g : group_) ++group_start_[static_cast<std::size_t>(g) + 1];
  for (std::size_t g = 0; g < static_cast<std::size_t>(groups_n_); ++g) group_start_[g + 1] += group_start_[g];
  group_rows_.assign(static_cast<std::size_t>(ranks_), 0);
  std::vector<std::int32_t> fill(group_start_.begin(), group_start_.end() - 1);
  for (std::int32_t r = 0; r < ranks_; ++r) group_rows_[static_cast<std::size_t>(fill[static_cast<std::size_t>(group_[static_cast<std::size_t>(r)])]++)] = r;
  // The rows a group's reference is taken over: all of them up to reference_sample,
  // else that many evenly spaced.
  const auto cap = static_cast<std::size_t>(cfg_.reference_sample);
  sample_start_.assign(static_cast<std::size_t>(groups_n_) + 1, 0);
  sample_rows_.clear();
  for (std::size_t g = 0; g < static_cast<std::size_t>(groups_n_); ++g) {
    const auto n = static_cast<std::size_t>(group_start_[g + 1] - group_start_[g]);
    const std::size_t take = std::min(n, cap);
    for (std::size_t i = 0; i < take; ++i) sample_rows_.push_back(group_rows_[static_cast<std::size_t>(group_start_[g]) + i * n / take]);
    sample_start_[g + 1] = static_cast<std::int32_t>(sample_rows_.size());
  }
  unjudged_.clear();
  for (std::int32_t r = 0; r < ranks_; ++r) {
    const auto g = static_cast<std::size_t>(group_[static_cast<std::size_t>(r)]);
    if (group_start_[g + 1] - group_start_[g] == 1) unjudged_.push_back(r);
  }
  const std::size_t GS = static_cast<std::size_t>(groups_n_) * S;
  refs_.assign(GS, GroupReference{});
  hi_.assign(GS, kInf);
  lo_.assign(GS, -kInf);
  const std::size_t blocks = (GS + kNoiseLanes - 1) / kNoiseLanes;
  noise_ring_.assign(blocks * kNoiseLanes * static_cast<std::size_t>(cfg_.noise_memory),
                     std::numeric_limits<float>::infinity());
  noise_count_.assign(GS, 0);
  noise_slot_.assign(GS, 0);
  noise_due_.assign(blocks * kNoiseLanes, 0);
  sigma_.assign(GS, cfg_.min_noise);
  busy_.assign(GS, 0);
  spike_rate_.assign(GS, 0.0);
  spikes_.assign(GS, 0);
  late_groups_.assign(GS, 0);
  hi_ms_.assign(GS, kInf);
  lo_ms_.assign(GS, -kInf);
  imbalance_.assign(S, Imbalance{});
  entries_.clear();
  released_.clear();
  sequential_.reset(static_cast<std::size_t>(ranks_), S);
  in_sample_.assign(static_cast<std::size_t>(ranks_), 0);
  for (std::int32_t r : sample_rows_) in_sample_[static_cast<std::size_t>(r)] = 1;
  // The cells tested: every rank with a peer, in every compute stage.
  const auto compute = static_cast<std::int64_t>(std::count(roles_.begin(), roles_.end(), Role::kCompute));
  const std::int64_t cells = (ranks_ - static_cast<std::int64_t>(unjudged_.size())) * compute;
  const bool tested = cfg_.sequential_budget > 0.0 && cells > 0;
  sequential_h_ = tested ? sequential_threshold(cells, cfg_.sequential_budget) : kInf;
  reports_ = 0;
}

void ConfirmTracker::accumulate(const double* ms) {
  const std::size_t S = stages_.size();
  const double h = sequential_h_;
  if (!std::isfinite(h)) return;
  for (std::size_t g = 0; g < static_cast<std::size_t>(groups_n_); ++g) {
    if (group_start_[g + 1] - group_start_[g] < 2) continue;
    const std::int32_t* rows = group_rows_.data() + group_start_[g];
    const auto n = static_cast<std::size_t>(group_start_[g + 1] - group_start_[g]);
    for (std::size_t s = 0; s < S; ++s) {
      if (roles_[s] != Role::kCompute || !judged(g * S + s)) continue;
      sequential_.add(ms, S, s, rows, n, sample_rows_.data() + sample_start_[g],
                      static_cast<std::size_t>(sample_start_[g + 1] - sample_start_[g]), in_sample_, h);
      // Halfway to the alarm: tracked from now on, so that its median excess is known by then.
      for (std::size_t i = 0; i < n; ++i) {
        if (sequential_.level(static_cast<std::size_t>(rows[i]), s) >= h / 2) {
          entry(rows[i], static_cast<std::int32_t>(s), Dir::kSlow);
        }
      }
    }
  }
}

void ConfirmTracker::take_window(const WindowEvidence& w) {
  window_ = w;
  window_rank_.clear();
  for (std::size_t i = 0; i < window_.anomalies.size(); ++i) window_rank_[window_.anomalies[i].rank] = i;
}

void ConfirmTracker::references(const double* ms) {
  const std::size_t S = stages_.size();
  budget_ms_ = 0.0;
  // `communication` is the union of the per-op columns (the all-reduce and the pipeline
  // waits of one rank together): beside them its shortest time is no late arrival, so it
  // is judged only when no per-op column has data this report (the sampled rows decide).
  skip_union_ = false;
  for (std::size_t s = 0; s < S && union_stage_ >= 0 && !skip_union_; ++s) {
    if (roles_[s] == Role::kCompute || static_cast<std::int32_t>(s) == union_stage_) continue;
    for (std::int32_t r : sample_rows_) skip_union_ = skip_union_ || !std::isnan(ms[static_cast<std::size_t>(r) * S + s]);
  }
  for (std::size_t g = 0; g < static_cast<std::size_t>(groups_n_); ++g) {
    double compute_ms = 0.0, collective_ms = 0.0;
    const std::int32_t* rows = sample_rows_.data() + sample_start_[g];
    const auto take = static_cast<std::size_t>(sample_start_[g + 1] - sample_start_[g]);
    const bool exact = group_start_[g + 1] - group_start_[g] <= cfg_.reference_sample;
    if (take <= kColumnSortRows) {
      references_of_rows(ms, S, rows, take, exact, refs_.data() + g * S);
    } else {
      for (std::size_t s = 0; s < S; ++s) {
        values_.clear();
        for (std::size_t i = 0; i < take; ++i) {
          const double t = ms[static_cast<std::size_t>(rows[i]) * S + s];
          if (!std::isnan(t)) values_.push_back(t);
        }
        refs_[g * S + s] = reference_of(values_, exact);
      }
    }
    for (std::size_t s = 0; s < S; ++s) {
      const std::size_t gs = g * S + s;
      if (std::isfinite(refs_[gs].median)) {
        if (roles_[s] == Role::kCompute) compute_ms += refs_[gs].median;
        if (roles_[s] == Role::kCollective) collective_ms = std::max(collective_ms, refs_[gs].median);
      }
      hi_[gs] = hi_ms_[gs] = kInf;
      lo_[gs] = lo_ms_[gs] = -kInf;
      if (!judged(gs) || roles_[s] == Role::kP2p || !judged_stage(s)) continue;
      const GroupReference& ref = refs_[gs];
      const double med = ref.median, band = cfg_.noise_sigmas * sigma(gs);
      // Minimum effect (the slow-rank rule) and noise band, both as ratios to the reference.
      hi_[gs] = std::max(std::min(cfg_.relative_threshold, 1.0 + cfg_.absolute_ms_threshold / med), 1.0 + band);
      // The same bands in ms for scan: a rank is slow only above the median, where its
      // leave-one-out reference is `above` (or `at`), and late only below it.
      hi_ms_[gs] = hi_[gs] * std::min(ref.above, ref.at);
      if (roles_[s] == Role::kCollective) {
        lo_[gs] = std::min(std::max(1.0 / cfg_.relative_threshold, 1.0 - cfg_.absolute_ms_threshold / med), 1.0 - band);
        lo_ms_[gs] = lo_[gs] * std::max(ref.below, ref.at);
      }
    }
    // The group's typical step: its compute plus its longest collective stage (the
    // collective stages overlap: `communication` is the union of the per-op ones).
    budget_ms_ = std::max(budget_ms_, compute_ms + collective_ms);
  }
}

void ConfirmTracker::scan(const double* ms) {
  const std::size_t S = stages_.size();
  // A cell inside both ms bounds (references) cannot be an outlier, so the pass over the
  // matrix is a max and a min per cell, without branches the data decides; the few cells
  // outside are checked exactly.
  outliers_.clear();
  candidates_.resize(static_cast<std::size_t>(ranks_));
  const std::size_t n = rows_outside(ms, static_cast<std::size_t>(ranks_), S, group_.data(), hi_ms_.data(),
                                     lo_ms_.data(), candidates_.data());
  for (std::size_t i = 0; i < n; ++i) {
    const auto r = static_cast<std::size_t>(candidates_[i]);
    const std::size_t base = static_cast<std::size_t>(group_[r]) * S;
    const double* row = ms + r * S;
    const double* hi = hi_ms_.data() + base;
    const double* lo = lo_ms_.data() + base;
    for (std::size_t s = 0; s < S; ++s) {
      const double t = row[s];
      if (!(t > hi[s] || t < lo[s])) continue;
      const double x = t / refs_[base + s].of(t);
      if (!(x > hi_[base + s] || x < lo_[base + s])) continue;
      const Dir dir = roles_[s] == Role::kCompute ? Dir::kSlow : (x > 1.0 ? Dir::kLink : Dir::kLate);
      outliers_.push_back((static_cast<std::int64_t>(r * S + s)) * 3 + static_cast<std::int64_t>(dir));
    }
  }
}

ConfirmTracker::Entry& ConfirmTracker::entry(std::int32_t rank, std::int32_t stage, Dir dir) {
  const std::int64_t key = (static_cast<std::int64_t>(rank) * static_cast<std::int64_t>(stages_.size()) + stage) * 3 +
                           static_cast<std::int64_t>(dir);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    Entry e;
    e.rank = rank;
    e.stage = stage;
    e.dir = dir;
    it = entries_.emplace(key, std::move(e)).first;
  }
  return it->second;
}

void ConfirmTracker::evaluate(Entry& e, const double* ms) {
  const std::size_t S = stages_.size(), s = static_cast<std::size_t>(e.stage);
  const std::size_t gs = static_cast<std::size_t>(group_[static_cast<std::size_t>(e.rank)]) * S + s;
  const std::size_t cell = static_cast<std::size_t>(e.rank) * S + s;
  e.strong = e.weak = e.window_ok = e.median_agrees = e.accumulated = e.holding = e.ended = false;
  e.votes = 0;
  e.wait_caused_ms = 0.0;
  e.waiting.clear();
  e.named = false;
  if (e.dir == Dir::kLink) {
    e.named = std::find(window_.link_suspects.begin(), window_.link_suspects.end(), e.rank) != window_.link_suspects.end();
  } else if (auto it = window_rank_.find(e.rank); it != window_rank_.end()) {
    const WindowRank& w = window_.anomalies[it->second];
    e.named = w.stages.empty() ? roles_[s] == Role::kCompute
                               : std::find(w.stages.begin(), w.stages.end(), stages_[s]) != w.stages.end();
    if (e.named) e.votes = w.votes;
  }
  const double t = ms[cell];
  e.finite = !std::isnan(t) && judged(gs) && judged_stage(s);
  if (!e.finite) return;
  const double ref = refs_[gs].of(t);
  const double x = t / ref, sig = sigma(gs);
  e.t = t;
  e.ref = ref;
  // Median ratio over the reports tracked (at most history) and its standard error
  // (1.2533 sigma / sqrt(n) for normal noise). The median, not the mean: one scheduling
  // spike of a 1 ms stage (10x for a report) must not hold a rank above its group.
  const auto H = static_cast<std::size_t>(cfg_.history);
  if (e.ratios.size() != H) e.ratios.assign(H, 0.0);
  e.ratios[static_cast<std::size_t>(e.ratios_n) % H] = x;
  ++e.ratios_n;
  const std::size_t n = std::min(static_cast<std::size_t>(e.ratios_n), H);
  values_.assign(e.ratios.begin(), e.ratios.begin() + static_cast<std::ptrdiff_t>(n));
  const double median = nan_median(Values(values_), median_scratch_);
  const double band = cfg_.window_sigmas * 1.2533 * sig / std::sqrt(static_cast<double>(n));
  // A full history: the ensemble names a rank from a window of reports, and a few tracked
  // reports of a rank with two scheduling spikes would give a median that is one of them.
  const bool enough = n >= H;
  // The impact rule: an excess too small against the step cannot be the job's problem. For
  // the window path, the typical excess (the median ratio's), summed over the rank's stages
  // afterwards (window_impact), must matter as much.
  const double excess_ms = e.dir == Dir::kLate ? ref - t : t - ref;
  e.typical_ms = e.dir == Dir::kLate ? ref * (1.0 - median) : ref * (median - 1.0);
  const bool matters = excess_ms >= cfg_.min_impact * budget_ms_;
  if (e.dir == Dir::kLate) {
    e.ratio = ref / t;
    e.median = 1.0 / median;
    e.strong = matters && x < lo_[gs];
    e.weak = x < 1.0 - sig;
    e.median_agrees = enough && median <= 1.0 - band;
  } else {
    e.ratio = x;
    e.median = median;
    e.strong = matters && x > hi_[gs];
    e.weak = x > 1.0 + sig;
    e.median_agrees = enough && median >= 1.0 + band;
    const double level = sequential_.level(static_cast<std::size_t>(e.rank), s);
    const double h = sequential_h_;
    e.holding = level >= h / 2;
    e.accumulated = level >= h && n >= static_cast<std::size_t>(cfg_.confirm_reports) &&
                    e.typical_ms >= cfg_.min_impact * budget_ms_;
  }
  e.ended = ended(e, n, sig);
  e.window_ok = e.named && e.median_agrees && !e.ended && fresh_history(e);
}

bool ConfirmTracker::fresh_history(const Entry& e) const {
  const auto it = released_.find(e.rank);
  return it == released_.end() || reports_ - it->second >= cfg_.history;
}

bool ConfirmTracker::ended(const Entry& e, std::size_t n, double sig) const {
  const auto H = static_cast<std::size_t>(cfg_.history);
  const auto R = static_cast<std::size_t>(cfg_.recover_reports);
  if (n < R) return false;
  for (std::size_t i = 1; i <= R; ++i) {
    const double x = e.ratios[(static_cast<std::size_t>(e.ratios_n) - i) % H];
    // In the ratios' own direction: t / ref above 1 is slow, below 1 late.
    const bool quiet = e.dir == Dir::kLate ? x > 1.0 / e.median + cfg_.window_sigmas * sig
                                           : x < e.median - cfg_.window_sigmas * sig;
    if (!quiet) return false;
  }
  return true;
}

void ConfirmTracker::window_impact() {
  // A 5 % slower rank is 2 ms late in a 40 ms forward and 4 ms in an 80 ms backward: under
  // 2 % of the step in each, over it in sum. Jitter of one 1 ms stage stays under it. The
  // sum speaks for the rank's costliest stage only: a rank 30 ms late in forward must not
  // carry a 0.2 ms wobble of its backward over the bar.
  typical_.clear();
  costliest_.clear();
  for (const auto& [key, e] : entries_) {
    (void)key;
    if (!(e.finite && e.median_agrees && e.dir == Dir::kSlow)) continue;
    typical_[e.rank] += e.typical_ms;
    auto [it, fresh] = costliest_.try_emplace(e.rank, e.typical_ms);
    if (!fresh) it->second = std::max(it->second, e.typical_ms);
  }
  const double impact_ms = cfg_.min_impact * budget_ms_;
  for (auto& [key, e] : entries_) {
    (void)key;
    if (!e.median_agrees) continue;
    if (e.dir == Dir::kSlow) {
      const bool costliest = e.finite && e.typical_ms >= costliest_[e.rank];
      e.median_agrees = e.typical_ms >= impact_ms || (costliest && typical_[e.rank] >= impact_ms);
    } else {
      e.median_agrees = e.typical_ms >= impact_ms;
    }
    e.window_ok = e.named && e.median_agrees && !e.ended && fresh_history(e);
  }
}

void ConfirmTracker::explained(Entry& e) const {
  e.strong = e.weak = e.window_ok = e.median_agrees = false;
  // Its late arrival this report is a slowness traced elsewhere (its own compute, a wait on a
  // peer), no evidence of its own: the ring keeps 1 in its place, so that the median a window
  // vote is checked against does not hold it as this entry's once that slowness ended.
  if (e.ratios_n > 0) e.ratios[static_cast<std::size_t>(e.ratios_n - 1) % static_cast<std::size_t>(cfg_.history)] = 1.0;
}

void ConfirmTracker::add_waiting(Entry& culprit, std::int32_t rank) {
  // A rank waits in several collective stages (communication and communication/<op>): once.
  if (std::find(culprit.waiting.begin(), culprit.waiting.end(), rank) == culprit.waiting.end()) {
    culprit.waiting.push_back(rank);
  }
}

void ConfirmTracker::trace_blame(const double* ms) {
  const std::size_t S = stages_.size();
  // Whether a rank waited on a pipeline peer: a p2p time beyond its group's band.
  const auto waited = [&](std::int32_t rank) {
    for (std::size_t s = 0; s < S; ++s) {
      if (roles_[s] != Role::kP2p) continue;
      const std::size_t gs = static_cast<std::size_t>(group_[static_cast<std::size_t>(rank)]) * S + s;
      const double t = ms[static_cast<std::size_t>(rank) * S + s];
      if (std::isnan(t) || !judged(gs)) continue;
      const double med = refs_[gs].median;
      const double band = std::max(std::min(cfg_.relative_threshold, 1.0 + cfg_.absolute_ms_threshold / med),
                                   1.0 + cfg_.noise_sigmas * sigma(gs));
      if (t / refs_[gs].of(t) > band) return true;
    }
    return false;
  };
  slow_.clear();
  std::fill(late_groups_.begin(), late_groups_.end(), 0);
  for (auto& [key, e] : entries_) {
    (void)key;
    if (!e.finite) continue;
    const std::size_t gs = static_cast<std::size_t>(group_[static_cast<std::size_t>(e.rank)]) * S +
                           static_cast<std::size_t>(e.stage);
    if (e.dir == Dir::kLate && e.strong) late_groups_[gs] = 1;
    if (e.dir != Dir::kSlow || !(e.strong || e.window_ok || e.accumulated || e.state == State::kStraggler)) continue;
    const double excess = e.t - e.ref;
    auto it = std::find_if(slow_.begin(), slow_.end(), [&](const SlowRank& x) { return x.rank == e.rank; });
    if (it == slow_.end()) {
      slow_.push_back(SlowRank{e.rank, group_[static_cast<std::size_t>(e.rank)], e.stage, excess, false});
    } else if (excess > it->excess_ms) {
      it->stage = e.stage;
      it->excess_ms = excess;
    }
  }
  for (SlowRank& x : slow_) x.waited = waited(x.rank);
  for (auto& [key, e] : entries_) {
    (void)key;
    if (!e.finite) continue;
    const std::int32_t g = group_[static_cast<std::size_t>(e.rank)];
    if (e.dir == Dir::kLink && late_groups_[static_cast<std::size_t>(g) * S + static_cast<std::size_t>(e.stage)]) {
      e.strong = e.weak = e.window_ok = false;  // long because it waited on a late peer
      continue;
    }
    if (e.dir == Dir::kLink && !slow_.empty()) {
      // Long while some rank computes slowly: its wait, through a group we may not see.
      e.strong = e.weak = e.window_ok = false;
      const SlowRank& culprit = *std::max_element(slow_.begin(), slow_.end(), [](const SlowRank& a, const SlowRank& b) {
        return a.excess_ms < b.excess_ms;
      });
      Entry& c = entry(culprit.rank, culprit.stage, Dir::kSlow);
      c.wait_caused_ms += e.t - e.ref;
      if (culprit.rank != e.rank) add_waiting(c, e.rank);
      continue;
    }
    if (e.dir != Dir::kLate || !(e.strong || e.window_ok || e.state == State::kStraggler)) continue;
    const Blame b = trace_wait(e.rank, g, waited(e.rank), slow_);
    if (b.rank < 0 && !b.waited) continue;  // unexplained: the late rank's own evidence
    explained(e);
    if (b.rank < 0) continue;
    Entry& culprit = entry(b.rank, b.stage, Dir::kSlow);
    culprit.wait_caused_ms += e.ref - e.t;
    if (b.rank != e.rank) add_waiting(culprit, e.rank);
  }
}

void ConfirmTracker::advance(Entry& e, std::int64_t step) {
  if (!e.finite) {
    ++e.idle;
    return;
  }
  const std::uint64_t keep = cfg_.history >= 64 ? ~0ULL : ((1ULL << cfg_.history) - 1);
  e.strong_mask = ((e.strong_mask << 1) | (e.strong ? 1ULL : 0ULL)) & keep;
  e.weak_mask = ((e.weak_mask << 1) | (e.weak ? 1ULL : 0ULL)) & keep;
  e.seen = std::min(e.seen + 1, cfg_.history);
  e.streak = e.strong ? e.streak + 1 : 0;
  e.calm = e.strong ? 0 : e.calm + 1;
  const std::size_t gs = static_cast<std::size_t>(group_[static_cast<std::size_t>(e.rank)]) * stages_.size() +
                         static_cast<std::size_t>(e.stage);
  const bool persistent = e.streak >= needed_streak(gs);
  if (e.state == State::kStraggler) {
    e.persistent = e.persistent || persistent;
    e.by_window = e.by_window || e.window_ok;
    e.by_sequential = e.by_sequential || e.accumulated;
    // Confirmed by the ensemble: kept while the median of its recent ratios still agrees (the
    // ensemble's answer is up to window_every reports old, so its naming alone keeps nothing).
    // Confirmed by accumulated evidence alone: kept while the statistic holds half its alarm.
    const bool keep_it = e.strong || e.window_ok || e.calm < cfg_.recover_reports ||
                         (e.by_window && e.median_agrees && !e.ended) ||
                         (e.by_sequential && !e.persistent && e.holding);
    if (!keep_it) {
      e.state = State::kRecovered, e.since = step, e.listed = 0;
      released_[e.rank] = reports_;
      // The statistic sits near its alarm after a long slowdown and falls slowly while the
      // rank is among its peers: a released rank must not be confirmed again on old evidence.
      sequential_.restart(static_cast<std::size_t>(e.rank), static_cast<std::size_t>(e.stage));
    }
  } else if (persistent || e.window_ok || e.accumulated) {
    e.state = State::kStraggler;
    e.since = step;
    e.persistent = persistent;
    e.by_window = e.window_ok;
    e.by_sequential = e.accumulated;
  } else if (e.strong) {
    if (e.state != State::kSuspected) e.state = State::kSuspected, e.since = step;
  } else if (e.state == State::kSuspected) {
    e.state = State::kHealthy;
    e.since = step;
  } else if (e.state == State::kRecovered && ++e.listed >= cfg_.history) {
    e.state = State::kHealthy;  // listed for `history` reports, the release's included
    e.since = step;
  }
  const bool quiet = (e.state == State::kHealthy || e.state == State::kRecovered) && !e.strong && !e.named && !e.holding;
  e.idle = quiet ? e.idle + 1 : 0;
}

void ConfirmTracker::judge_imbalance(std::int64_t step) {
  const std::size_t S = stages_.size();
  for (std::size_t s = 0; s < S; ++s) {
    if (roles_[s] != Role::kCompute || groups_n_ < 2) continue;
    // A group's work: the median of its ranks less its slowest (the leave-one-out median of
    // a rank above the median; in a group of two, its faster rank; in a sampled group, the
    // sample's median), so that one slow rank, suspected or not yet, is that rank's slowdown
    // and never its group's imbalance.
    values_.assign(static_cast<std::size_t>(groups_n_), std::numeric_limits<double>::quiet_NaN());
    for (std::size_t g = 0; g < static_cast<std::size_t>(groups_n_); ++g) {
      const GroupReference& ref = refs_[g * S + s];
      values_[g] = ref.count >= 2 ? ref.above : ref.median;
    }
    // The slowest and fastest group (the first of equals); their works kept in registers, so
    // that no compare waits on the load of the previous winner's.
    std::int32_t hi = -1, lo = -1;
    double hi_w = 0.0, lo_w = 0.0;
    for (std::int32_t g = 0; g < groups_n_; ++g) {
      const double w = values_[static_cast<std::size_t>(g)];
      if (!(w > 0.0)) continue;
      if (hi < 0 || w > hi_w) hi = g, hi_w = w;
      if (lo < 0 || w < lo_w) lo = g, lo_w = w;
    }
    Imbalance& im = imbalance_[s];
    bool ev = false;
    double ratio = 1.0;
    if (hi >= 0 && lo >= 0 && hi != lo && reports_ >= cfg_.min_reports) {
      const double sig = std::max(sigma(static_cast<std::size_t>(hi) * S + s), sigma(static_cast<std::size_t>(lo) * S + s));
      ratio = hi_w / lo_w;
      // The impact rule too: the slow group's excess is paid every step, and must matter.
      ev = ratio >= std::min(cfg_.relative_threshold, 1.0 + cfg_.absolute_ms_threshold / lo_w) &&
           ratio - 1.0 >= cfg_.noise_sigmas * sig && hi_w - lo_w >= cfg_.min_impact * budget_ms_;
    }
    // A streak is one group slower report after report: groups taking turns is jitter.
    im.streak = !ev ? 0 : (im.streak > 0 && hi == im.candidate ? im.streak + 1 : 1);
    if (ev) im.candidate = hi;
    const bool listed = im.state == State::kImbalance;
    const bool agrees = ev && (!listed || hi == im.slow_group);
    if (agrees) {
      im.ratio = ratio, im.hi_ms = hi_w, im.lo_ms = lo_w;
    } else if (listed && lo >= 0 && values_[static_cast<std::size_t>(im.slow_group)] > 0.0) {
      // Still listed: its group's ratio in this report, not the one it was found at.
      im.hi_ms = values_[static_cast<std::size_t>(im.slow_group)];
      im.lo_ms = lo_w;
      im.ratio = im.hi_ms / lo_w;
    }
    const std::uint64_t keep = cfg_.history >= 64 ? ~0ULL : ((1ULL << cfg_.history) - 1);
    im.mask = ((im.mask << 1) | (agrees ? 1ULL : 0ULL)) & keep;
    im.seen = std::min(im.seen + 1, cfg_.history);
    im.calm = agrees ? 0 : im.calm + 1;
    if (listed && im.calm >= cfg_.recover_reports) im.state = State::kHealthy, im.since = step;
    if (im.state != State::kImbalance && im.streak >= cfg_.confirm_reports) {
      // The reports agreeing with it are its streak's, also those counted against a group
      // listed before (released in this report); its ratio is the latest report's.
      im.state = State::kImbalance, im.since = step, im.slow_group = im.candidate, im.calm = 0;
      im.mask = (im.streak >= 64 ? ~0ULL : (1ULL << im.streak) - 1) & keep;
      im.ratio = ratio, im.hi_ms = hi_w, im.lo_ms = lo_w;
    }
  }
}

// The chance per report that jitter alone makes some rank of a group reach a streak long
// enough to confirm, per stage: 2e-4 (a healthy run of 50 reports x 5 stages then expects
// 0.05 false confirmations per group).
constexpr double kStreakBudget = 2e-4;

std::int32_t ConfirmTracker::needed_streak(std::size_t gs) const {
  const double rate = spike_rate_[gs];
  const std::size_t g = gs / stages_.size();
  const double size = static_cast<double>(group_start_[g + 1] - group_start_[g]);
  if (!(rate > 0.0)) return cfg_.confirm_reports;
  const double n = std::ceil(std::log(kStreakBudget / size) / std::log(std::min(rate, 0.9)));
  return static_cast<std::int32_t>(std::clamp(n, static_cast<double>(cfg_.confirm_reports),
                                              static_cast<double>(std::max(cfg_.history, cfg_.confirm_reports))));
}

void ConfirmTracker::learn_noise() {
  const std::size_t S = stages_.size(), mem = static_cast<std::size_t>(cfg_.noise_memory);
  std::fill(busy_.begin(), busy_.end(), 0);
  std::fill(spikes_.begin(), spikes_.end(), 0);
  for (const auto& [key, e] : entries_) {
    (void)key;
    const std::size_t gs = static_cast<std::size_t>(group_[static_cast<std::size_t>(e.rank)]) * S +
                           static_cast<std::size_t>(e.stage);
    if (e.strong || e.state == State::kSuspected || e.state == State::kStraggler) busy_[gs] = 1;
    // The starts of streaks: for independent jitter about its spike rate, while a real
    // straggler's own streak counts once (in a group of two it would double the rate).
    if (e.strong && e.streak == 1 && e.dir != Dir::kLink) ++spikes_[gs];
  }
  const double beta = 1.0 / static_cast<double>(mem);
  for (std::size_t g = 0; g < static_cast<std::size_t>(groups_n_); ++g) {
    const double size = static_cast<double>(group_start_[g + 1] - group_start_[g]);
    if (size < 2) continue;
    for (std::size_t gs = g * S; gs < (g + 1) * S; ++gs) {
      if (!judged(gs)) continue;
      // Without a start the share is 0 (0 / size): no division.
      const double share = spikes_[gs] != 0 ? static_cast<double>(spikes_[gs]) / size : 0.0;
      spike_rate_[gs] += beta * (share - spike_rate_[gs]);
    }
  }
  // This report's MAD into each ring; the median of the filled entries is due while the
  // ring fills, then every 4th report (the noise moves slowly and this is per (group, stage)).
  bool any_due = false;
  for (std::size_t gs = 0; gs < refs_.size(); ++gs) {
    const double mad = refs_[gs].mad;
    noise_due_[gs] = 0;
    if (busy_[gs] || !std::isfinite(mad)) continue;
    const std::size_t slot = noise_slot_[gs];
    noise_ring_[(gs / kNoiseLanes * mem + slot) * kNoiseLanes + gs % kNoiseLanes] = static_cast<float>(mad);
    noise_slot_[gs] = static_cast<std::uint8_t>(slot + 1 == mem ? 0 : slot + 1);
    const std::int32_t count = ++noise_count_[gs];
    if (static_cast<std::size_t>(count) <= mem || count % 4 == 0) {
      noise_due_[gs] = static_cast<std::int32_t>(std::min(static_cast<std::size_t>(count), mem));
      any_due = true;
    }
  }
  if (!any_due) return;
  float median[kNoiseLanes];
  for (std::size_t b = 0; b * kNoiseLanes < refs_.size(); ++b) {
    const std::int32_t* due = noise_due_.data() + b * kNoiseLanes;
    if (std::all_of(due, due + kNoiseLanes, [](std::int32_t n) { return n == 0; })) continue;
    ring_medians(noise_ring_.data() + b * kNoiseLanes * mem, mem, due, median);
    for (std::size_t l = 0; l < kNoiseLanes; ++l) {
      if (due[l] == 0) continue;
      sigma_[b * kNoiseLanes + l] = std::max(cfg_.min_noise, kMadToSigma * static_cast<double>(median[l]));
    }
  }
}

}  // namespace relax_straggler::core::confirm
