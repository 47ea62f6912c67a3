// ConfirmTracker::update: the per-report flow, and the result it returns.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/confirm/tracker.h"
#include "core/stats.h"

namespace relax_straggler::core::confirm {
namespace {

int severity(State s) {
  switch (s) {
    case State::kStraggler: return 0;
    case State::kImbalance: return 1;
    case State::kSuspected: return 2;
    case State::kRecovered: return 3;
    default: return 4;
  }
}

std::int32_t bits(std::uint64_t mask, std::int32_t n) {
  std::int32_t c = 0;
  for (std::int32_t i = 0; i < n; ++i) c += static_cast<std::int32_t>((mask >> i) & 1ULL);
  return c;
}

void validate(const StepMatrix& m, const std::vector<std::int32_t>& groups, const std::vector<double>& workload) {
  if (m.kinds.size() != m.stages.size()) throw std::invalid_argument("matrix: kinds and stages differ in length");
  if (m.num_ranks < 0 || m.ms.size() != static_cast<std::size_t>(m.num_ranks) * m.num_stages()) {
    throw std::invalid_argument("matrix: ms size does not match num_ranks x stages");
  }
  const auto ranks = static_cast<std::size_t>(m.num_ranks);
  if (!groups.empty() && groups.size() != ranks) {
    throw std::invalid_argument("groups has " + std::to_string(groups.size()) + " entries, expected one per rank (" +
                                std::to_string(ranks) + ")");
  }
  for (std::size_t r = 0; r < groups.size(); ++r) {
    if (groups[r] < 0) throw std::invalid_argument("groups[" + std::to_string(r) + "] is negative");
  }
  if (!workload.empty() && workload.size() != ranks) {
    throw std::invalid_argument("workload has " + std::to_string(workload.size()) + " entries, expected one per rank (" +
                                std::to_string(ranks) + ")");
  }
  for (std::size_t r = 0; r < workload.size(); ++r) {
    if (!(std::isfinite(workload[r]) && workload[r] > 0.0)) {
      throw std::invalid_argument("workload[" + std::to_string(r) + "] must be finite and > 0, got " +
                                  std::to_string(workload[r]));
    }
  }
}

}  // namespace

ConfirmResult ConfirmTracker::update(const StepMatrix& matrix, const std::vector<std::int32_t>& groups,
                                     const std::vector<double>& workload, const WindowEvidence* window) {
  validate(matrix, groups, workload);
  const bool same_groups = groups.empty() ? std::all_of(group_.begin(), group_.end(), [](std::int32_t g) { return g == 0; })
                                          : groups == group_;
  const bool fresh = reports_ == 0 || matrix.num_ranks != ranks_ || matrix.stages != stages_ || !same_groups;
  if (fresh) layout(matrix, groups);
  if (window != nullptr) take_window(*window);
  ++reports_;
  const std::size_t S = stages_.size();
  const double* ms = matrix.ms.data();
  if (!workload.empty()) {
    // Per-token comparison in ms a reader recognises: t x mean(workload) / workload_r.
    double mean = 0.0;
    for (double w : workload) mean += w;
    mean /= static_cast<double>(workload.size());
    scaled_ms_.assign(matrix.ms.begin(), matrix.ms.end());
    for (std::size_t r = 0; r < workload.size(); ++r) {
      for (std::size_t s = 0; s < S; ++s) {
        if (scaled_[s]) scaled_ms_[r * S + s] *= mean / workload[r];
      }
    }
    ms = scaled_ms_.data();
  }
  references(ms);
  scan(ms);
  accumulate(ms);
  for (std::int64_t key : outliers_) {
    const auto cell = key / 3;
    entry(static_cast<std::int32_t>(cell / static_cast<std::int64_t>(S)),
          static_cast<std::int32_t>(cell % static_cast<std::int64_t>(S)), static_cast<Dir>(key % 3));
  }
  // Ranks the ensemble names are tracked from then on: their mean ratio must agree.
  for (const WindowRank& w : window_.anomalies) {
    if (w.rank < 0 || w.rank >= ranks_) continue;
    for (std::size_t s = 0; s < S; ++s) {
      const bool named = w.stages.empty() ? roles_[s] == Role::kCompute
                                          : std::find(w.stages.begin(), w.stages.end(), stages_[s]) != w.stages.end();
      if (!named || roles_[s] == Role::kP2p || !judged_stage(s)) continue;
      entry(w.rank, static_cast<std::int32_t>(s), roles_[s] == Role::kCollective ? Dir::kLate : Dir::kSlow);
    }
  }
  for (std::int32_t rank : window_.link_suspects) {
    if (rank < 0 || rank >= ranks_) continue;
    for (std::size_t s = 0; s < S; ++s) {
      if (roles_[s] == Role::kCollective && judged_stage(s)) entry(rank, static_cast<std::int32_t>(s), Dir::kLink);
    }
  }
  for (auto& [key, e] : entries_) {
    (void)key;
    evaluate(e, ms);
  }
  window_impact();
  trace_blame(ms);
  for (auto& [key, e] : entries_) {
    (void)key;
    advance(e, matrix.step);
  }
  judge_imbalance(matrix.step);
  learn_noise();
  ConfirmResult out = result(matrix.step, fresh);
  for (auto it = entries_.begin(); it != entries_.end();) {
    it = it->second.idle >= cfg_.history ? entries_.erase(it) : std::next(it);
  }
  return out;
}

double ConfirmTracker::agreeing_ratio(const Entry& e, std::uint64_t agree) {
  // The ring and the masks advance together, on each report with a time in the stage: bit i
  // of a mask is the report i places before the newest in the ring.
  const auto H = static_cast<std::int64_t>(e.ratios.size());
  const std::int64_t n = std::min<std::int64_t>({static_cast<std::int64_t>(e.seen), e.ratios_n, H});
  std::vector<double> values;
  values.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    if (((agree >> i) & 1ULL) == 0) continue;
    const double x = e.ratios[static_cast<std::size_t>((e.ratios_n - 1 - i) % H)];
    values.push_back(e.dir == Dir::kLate ? 1.0 / x : x);
  }
  if (values.empty()) return n > 0 ? e.median : e.ratio;
  return nan_median(Values(values));
}

ConfirmResult ConfirmTracker::result(std::int64_t step, bool reset) const {
  const std::size_t S = stages_.size();
  ConfirmResult out;
  out.step = step;
  out.reset = reset;
  out.reports = reports_;
  out.unjudged_ranks = unjudged_;
  bool any_judged = false;
  for (std::size_t gs = 0; gs < refs_.size() && !any_judged; ++gs) any_judged = judged(gs);
  for (const auto& [key, e] : entries_) {
    (void)key;
    if (e.state != State::kSuspected && e.state != State::kStraggler && e.state != State::kRecovered) continue;
    Finding f;
    f.rank = e.rank;
    f.group = group_[static_cast<std::size_t>(e.rank)];
    f.stage = e.stage;
    f.stage_name = stages_[static_cast<std::size_t>(e.stage)];
    f.state = e.state;
    f.since_step = e.since;
    f.persistent = e.persistent;
    f.by_window = e.by_window;
    f.by_sequential = e.by_sequential;
    const bool gradual = e.by_window || e.by_sequential;  // confirmed over reports, not one at a time
    const std::uint64_t agree = e.state == State::kRecovered ? ~e.strong_mask
                                                             : (e.strong_mask | (gradual ? e.weak_mask : 0ULL));
    f.ratio = agreeing_ratio(e, agree);
    f.facts.reports_seen = e.seen;
    f.facts.reports_agreeing = bits(agree, e.seen);
    f.confidence = e.seen > 0 ? static_cast<double>(f.facts.reports_agreeing) / e.seen : 0.0;
    f.facts.rank_ms = e.t;
    f.facts.ref_ms = e.ref;
    f.facts.excess_ms = e.dir == Dir::kLate ? e.ref - e.t : e.t - e.ref;
    f.facts.median_ratio = e.median;
    f.facts.noise = sigma(static_cast<std::size_t>(f.group) * S + static_cast<std::size_t>(e.stage));
    f.facts.wait_caused_ms = e.wait_caused_ms;
    f.facts.waiting_ranks = e.waiting;
    f.facts.window_votes = e.votes;
    f.cause = e.dir == Dir::kLink   ? Cause::kLink
              : e.dir == Dir::kLate ? Cause::kUnknown
              : e.stage == data_stage_ ? Cause::kData
                                       : Cause::kCompute;
    out.findings.push_back(std::move(f));
  }
  for (std::size_t s = 0; s < imbalance_.size(); ++s) {
    const Imbalance& im = imbalance_[s];
    if (im.state != State::kImbalance) continue;
    Finding f;
    f.group = im.slow_group;
    f.stage = static_cast<std::int32_t>(s);
    f.stage_name = stages_[s];
    f.state = State::kImbalance;
    f.since_step = im.since;
    f.ratio = im.ratio;
    f.persistent = true;
    f.facts.reports_seen = im.seen;
    f.facts.reports_agreeing = bits(im.mask, im.seen);
    f.confidence = im.seen > 0 ? static_cast<double>(f.facts.reports_agreeing) / im.seen : 0.0;
    f.facts.rank_ms = im.hi_ms;
    f.facts.ref_ms = im.lo_ms;
    f.facts.excess_ms = im.hi_ms - im.lo_ms;
    f.cause = Cause::kImbalance;
    out.findings.push_back(std::move(f));
  }
  std::sort(out.findings.begin(), out.findings.end(), [](const Finding& a, const Finding& b) {
    if (severity(a.state) != severity(b.state)) return severity(a.state) < severity(b.state);
    if (a.facts.excess_ms != b.facts.excess_ms) return a.facts.excess_ms > b.facts.excess_ms;
    if (a.rank != b.rank) return a.rank < b.rank;
    return a.stage < b.stage;
  });
  // The job's status names what a person acts on: a suspected rank is a finding, and the job
  // is healthy (or recovered) while nothing is confirmed.
  const auto top = std::find_if(out.findings.begin(), out.findings.end(),
                                [](const Finding& f) { return f.state != State::kSuspected; });
  out.status = top != out.findings.end() ? top->state
               : any_judged || !out.findings.empty() ? State::kHealthy
                                                     : State::kInsufficientEvidence;
  return out;
}

}  // namespace relax_straggler::core::confirm
