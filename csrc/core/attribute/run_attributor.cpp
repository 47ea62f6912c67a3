#include "core/attribute/run_attributor.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "core/stats.h"

namespace relax_straggler::core::attribute {
namespace {

FindingKind kind_of(P2pCause cause) {
  switch (cause) {
    case P2pCause::kLink: return FindingKind::kLink;
    case P2pCause::kSendSide: return FindingKind::kSendSide;
    case P2pCause::kRecvSide: return FindingKind::kRecvSide;
    case P2pCause::kNodeNetwork: return FindingKind::kNodeNetwork;
    case P2pCause::kExplained: break;
  }
  throw std::logic_error("an explained p2p wait is not a finding");
}

}  // namespace

const char* finding_kind_name(FindingKind kind) {
  switch (kind) {
    case FindingKind::kIndividual: return "individual";
    case FindingKind::kStructural: return "structural";
    case FindingKind::kLink: return "link";
    case FindingKind::kSendSide: return "send_side";
    case FindingKind::kRecvSide: return "recv_side";
    case FindingKind::kNodeNetwork: return "node_network";
    case FindingKind::kP2pSlowSteps: return "p2p_slow_steps";
  }
  return "unknown";
}

RunAttributor::RunAttributor(GridShape shape, std::vector<std::string> compute_stages, AttributionConfig config,
                             std::vector<std::string> collective_stages)
    : shape_(shape), stages_(std::move(compute_stages)), collective_stages_(std::move(collective_stages)),
      config_(config) {
  if (shape_.dp < 1 || shape_.pp < 1) {
    throw std::invalid_argument("grid shape must have dp >= 1 and pp >= 1, got dp " + std::to_string(shape_.dp) +
                                ", pp " + std::to_string(shape_.pp));
  }
  if (stages_.empty()) throw std::invalid_argument("at least one compute stage is needed");
  config_.validate();
  const auto workers = static_cast<std::size_t>(shape_.workers());
  worker_waits_explained_.assign(workers, 0);
  series_.assign(workers * kNumP2pOps, SeriesState{});
  late_arrivals_.assign(workers * collective_stages_.size(), 0);
}

void RunAttributor::count(Finding key, std::int64_t step, double ratio, double excess_ms) {
  const std::array<std::int32_t, 6> k{static_cast<std::int32_t>(key.kind), key.worker, key.peer_worker,
                                      key.pp_rank, key.stage, key.op};
  auto [it, inserted] = accum_index_.emplace(k, accums_.size());
  if (inserted) {
    key.first_step = step;
    accums_.push_back(Accum{key});
  }
  Accum& a = accums_[it->second];
  // Both ends of a link report it in the same step: the step counts once.
  if (!inserted && a.finding.last_step == step && a.finding.steps_flagged > 0) return;
  a.finding.steps_flagged += 1;
  a.finding.last_step = step;
  a.finding.max_ratio = std::max(a.finding.max_ratio, ratio);
  a.sum_ratio += ratio;
  a.sum_excess_ms += excess_ms;
}

bool RunAttributor::classify_slow_step(double step_ms, bool& fast) {
  fast = false;
  if (shape_.pp != 2 || !std::isfinite(step_ms)) return false;
  bool slow = false;
  if (!recent_step_ms_.empty()) {
    std::vector<double> window(recent_step_ms_.begin(), recent_step_ms_.end());
    slow = step_ms > config_.slow_step_ratio * nan_median(Values(window));
    fast = !slow;
  }
  recent_step_ms_.push_back(step_ms);
  if (recent_step_ms_.size() > static_cast<std::size_t>(config_.slow_step_window)) recent_step_ms_.pop_front();
  return slow;
}

void RunAttributor::fold_p2p(const WorkerStep& step, const P2pStepResult& p2p, bool slow_step, bool fast_step) {
  const std::size_t workers = static_cast<std::size_t>(shape_.workers());
  for (std::size_t w = 0; w < workers; ++w) {
    for (std::size_t o = 0; o < kNumP2pOps; ++o) {
      const double x = step.p2p_ms[w * kNumP2pOps + o];
      if (!std::isfinite(x)) continue;
      SeriesState& s = series_[w * kNumP2pOps + o];
      const bool jump = x > config_.jump_ratio * s.previous_ms && x - s.previous_ms >= config_.absolute_ms_threshold;
      if (s.has_previous && jump) {
        jumps_.push_back({step.step, static_cast<std::int32_t>(w), static_cast<P2pOp>(o), x, s.previous_ms});
      }
      s.previous_ms = x;
      s.has_previous = true;
      s.sum_ms += x;
      ++s.count;
      if (!p2p.abnormal.empty() && p2p.abnormal[w * kNumP2pOps + o]) ++s.abnormal;
      if (slow_step) s.slow_sum_ms += x, ++s.slow_count;
      if (fast_step) s.fast_sum_ms += x, ++s.fast_count;
    }
  }
  for (const P2pFinding& f : p2p.findings) {
    const double ratio = f.ref_ms > 0.0 ? f.ms / f.ref_ms : 0.0;
    if (f.cause == P2pCause::kExplained) {
      ++worker_waits_explained_[static_cast<std::size_t>(f.blamed_worker)];
      ++series_[static_cast<std::size_t>(f.worker) * kNumP2pOps + static_cast<std::size_t>(f.op)].explained;
      continue;
    }
    Finding key;
    key.kind = kind_of(f.cause);
    key.worker = f.cause == P2pCause::kLink ? std::min(f.worker, f.blamed_worker) : f.worker;
    key.peer_worker = f.cause == P2pCause::kLink ? std::max(f.worker, f.blamed_worker) : -1;
    key.pp_rank = shape_.pp_rank(key.worker);
    key.op = f.cause == P2pCause::kLink ? -1 : static_cast<std::int32_t>(f.op);
    count(key, step.step, ratio, f.ms - f.ref_ms);
  }
}

StepAttribution RunAttributor::add_step(const WorkerStep& step) {
  const int has_p2p = step.p2p_ms.empty() ? 0 : 1;
  if (has_p2p_ >= 0 && has_p2p != has_p2p_) {
    throw std::invalid_argument("step " + std::to_string(step.step) + (has_p2p ? " has" : " lacks") +
                                " p2p times, unlike the steps before it");
  }
  const std::size_t collectives = collective_stages_.size();
  if (step.collective_ms.size() != static_cast<std::size_t>(shape_.workers()) * collectives) {
    throw std::invalid_argument("step " + std::to_string(step.step) + ": collective_ms has " +
                                std::to_string(step.collective_ms.size()) + " values, expected workers x " +
                                std::to_string(collectives) + " collective stages");
  }
  has_p2p_ = has_p2p;
  StepAttribution out;
  out.compute = classify_step(shape_, step, stages_.size(), config_);
  out.p2p = cross_validate_step(shape_, step, out.compute, config_);
  ++steps_;
  for (const ComputeFlag& f : out.compute.flags) {
    Finding key;
    key.kind = f.kind == SlowKind::kIndividual ? FindingKind::kIndividual : FindingKind::kStructural;
    key.worker = f.worker;
    key.pp_rank = f.pp_rank;
    key.stage = f.stage;
    count(key, step.step, f.ratio(), f.excess_ms());
  }
  if (has_p2p) {
    bool fast = false;
    const bool slow = classify_slow_step(step.step_ms, fast);
    if (slow) slow_steps_.push_back(step.step);
    fold_p2p(step, out.p2p, slow, fast);
  }
  find_late_arrivals(shape_, step.collective_ms, collectives, out.compute.budget_ms, config_, scratch_, out.late);
  for (const LateArrival& l : out.late) {
    ++late_arrivals_[static_cast<std::size_t>(l.worker) * collectives + static_cast<std::size_t>(l.stage)];
  }
  return out;
}

RunAttribution RunAttributor::finish() const {
  RunAttribution out;
  out.steps = steps_;
  out.jumps = jumps_;
  out.slow_steps = slow_steps_;
  out.late_arrivals = late_arrivals_;
  const double needed = config_.persistence * static_cast<double>(steps_);
  for (const Accum& a : accums_) {
    Finding f = a.finding;
    const double n = static_cast<double>(f.steps_flagged);
    f.mean_ratio = a.sum_ratio / n;
    f.mean_excess_ms = a.sum_excess_ms / n;
    f.persistent = n >= needed;
    if (f.kind == FindingKind::kIndividual) {
      f.waits_explained = worker_waits_explained_[static_cast<std::size_t>(f.worker)];
    } else if (f.kind == FindingKind::kStructural) {
      for (std::int32_t d = 0; d < shape_.dp; ++d) {
        f.waits_explained += worker_waits_explained_[static_cast<std::size_t>(shape_.index(d, f.pp_rank))];
      }
    }
    out.findings.push_back(f);
  }

  const std::size_t workers = static_cast<std::size_t>(shape_.workers());
  std::vector<double> means;
  for (std::size_t o = 0; o < kNumP2pOps; ++o) {
    means.clear();
    for (std::size_t w = 0; w < workers; ++w) {
      const SeriesState& s = series_[w * kNumP2pOps + o];
      if (s.count > 0) means.push_back(s.sum_ms / static_cast<double>(s.count));
    }
    if (means.empty()) continue;
    const double baseline = nan_median(Values(means));
    for (std::size_t w = 0; w < workers; ++w) {
      const SeriesState& s = series_[w * kNumP2pOps + o];
      if (s.count == 0) continue;
      const double mean = s.sum_ms / static_cast<double>(s.count);
      if (mean > config_.baseline_ratio * baseline && mean - baseline >= config_.absolute_ms_threshold) {
        out.baseline_outliers.push_back(
            {static_cast<std::int32_t>(w), static_cast<P2pOp>(o), mean, baseline, s.abnormal, s.explained});
      }
      if (shape_.pp != 2 || s.slow_count == 0 || s.fast_count == 0) continue;
      const double slow = s.slow_sum_ms / static_cast<double>(s.slow_count);
      const double fast = s.fast_sum_ms / static_cast<double>(s.fast_count);
      if (slow > config_.p2p_ratio * fast && slow - fast >= config_.absolute_ms_threshold) {
        Finding f;
        f.kind = FindingKind::kP2pSlowSteps;
        f.worker = static_cast<std::int32_t>(w);
        f.pp_rank = shape_.pp_rank(f.worker);
        f.op = static_cast<std::int32_t>(o);
        f.steps_flagged = s.slow_count;
        f.first_step = slow_steps_.front();
        f.last_step = slow_steps_.back();
        f.mean_ratio = f.max_ratio = fast > 0.0 ? slow / fast : 0.0;
        f.mean_excess_ms = slow - fast;
        f.persistent = true;
        out.findings.push_back(f);
      }
    }
  }
  std::stable_sort(out.findings.begin(), out.findings.end(), [](const Finding& a, const Finding& b) {
    if (a.persistent != b.persistent) return a.persistent;
    if (a.steps_flagged != b.steps_flagged) return a.steps_flagged > b.steps_flagged;
    return a.mean_excess_ms > b.mean_excess_ms;
  });
  return out;
}

}  // namespace relax_straggler::core::attribute
