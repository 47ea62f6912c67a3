#include "stage_timer.h"

#include <limits>
#include <stdexcept>
#include <string>

namespace relax_straggler::torch_ext {
namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr std::size_t kNoSlot = static_cast<std::size_t>(-1);
}  // namespace

StageTimer::StageTimer(int num_stages, std::int64_t interval, std::int64_t warmup_steps, std::size_t max_events,
                       bool use_cuda)
    : num_stages_(num_stages), interval_(interval), warmup_steps_(warmup_steps) {
  if (num_stages <= 0) throw std::invalid_argument("num_stages must be > 0, got " + std::to_string(num_stages));
  if (interval < 1) throw std::invalid_argument("interval must be >= 1, got " + std::to_string(interval));
  if (warmup_steps < 0) throw std::invalid_argument("warmup_steps must be >= 0, got " + std::to_string(warmup_steps));
  if (max_events < 2) throw std::invalid_argument("max_events must be >= 2, got " + std::to_string(max_events));
  if (use_cuda) {
#ifdef WITH_CUDA
    pool_ = make_cuda_event_pool(max_events);
#else
    throw std::invalid_argument("use_cuda=True but relax_straggler._C was built without CUDA");
#endif
  } else {
    pool_ = std::make_unique<HostEventPool>(max_events);
  }
  const auto n = static_cast<std::size_t>(num_stages);
  depth_.assign(n, 0);
  open_slot_.assign(n, kNoSlot);
  host_start_ns_.assign(n, 0);
  host_ms_.assign(n, 0.0);
  calls_.assign(n, 0);
  lost_.assign(n, false);
  pairs_.reserve(max_events / 2);
}

void StageTimer::check_stage(int stage) const {
  if (stage < 0 || stage >= num_stages_) {
    throw std::out_of_range("stage id " + std::to_string(stage) + " out of range [0, " + std::to_string(num_stages_) +
                            ")");
  }
}

void StageTimer::reset_step_state() {
  next_slot_ = 0;
  open_sections_ = 0;
  pairs_.clear();
  std::fill(depth_.begin(), depth_.end(), 0);
  std::fill(open_slot_.begin(), open_slot_.end(), kNoSlot);
  std::fill(host_ms_.begin(), host_ms_.end(), 0.0);
  std::fill(calls_.begin(), calls_.end(), 0);
  std::fill(lost_.begin(), lost_.end(), false);
}

bool StageTimer::begin_step(std::int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  reset_step_state();
  step_ = step;
  const bool sampled = step >= warmup_steps_ && step % interval_ == 0;
  sampled_.store(sampled, std::memory_order_relaxed);
  return sampled;
}

void StageTimer::start(int stage) {
  if (!sampled_.load(std::memory_order_relaxed)) return;
  check_stage(stage);
  std::lock_guard<std::mutex> lock(mu_);
  const auto s = static_cast<std::size_t>(stage);
  if (depth_[s]++ > 0) return;  // nested re-entry: the outermost section times it
  // Two slots for this section plus one end slot held for every section still open.
  if (next_slot_ + open_sections_ + 2 > pool_->capacity()) {
    // No room for this section's two events: lose it, and say so at read time.
    lost_[s] = true;
    ++dropped_sections_;
    open_slot_[s] = kNoSlot;
    return;
  }
  open_slot_[s] = next_slot_++;
  ++open_sections_;
  host_start_ns_[s] = HostEventPool::now_ns();
  pool_->record(open_slot_[s]);
  ++events_recorded_;
}

void StageTimer::stop(int stage) {
  if (!sampled_.load(std::memory_order_relaxed)) return;
  check_stage(stage);
  std::lock_guard<std::mutex> lock(mu_);
  const auto s = static_cast<std::size_t>(stage);
  if (depth_[s] == 0) {
    ++unmatched_stops_;
    return;
  }
  if (--depth_[s] > 0) return;
  if (open_slot_[s] == kNoSlot) return;  // its start was dropped
  const std::size_t end_slot = next_slot_++;  // held for it since start()
  --open_sections_;
  pool_->record(end_slot);
  ++events_recorded_;
  host_ms_[s] += static_cast<double>(HostEventPool::now_ns() - host_start_ns_[s]) * 1e-6;
  ++calls_[s];
  pairs_.push_back(Pair{stage, open_slot_[s], end_slot});
  open_slot_[s] = kNoSlot;
}

StepSample StageTimer::end_step() {
  std::lock_guard<std::mutex> lock(mu_);
  StepSample out;
  out.step = step_;
  out.sampled = sampled_.load(std::memory_order_relaxed);
  sampled_.store(false, std::memory_order_relaxed);
  if (!out.sampled) return out;

  pool_->synchronize();
  ++read_points_;
  const auto n = static_cast<std::size_t>(num_stages_);
  out.device_ms.assign(n, 0.0);
  for (const Pair& p : pairs_) out.device_ms[static_cast<std::size_t>(p.stage)] += pool_->elapsed_ms(p.start_slot, p.end_slot);
  out.host_ms = host_ms_;
  out.calls = calls_;
  for (std::size_t s = 0; s < n; ++s) {
    // A stage still open at the step end or one with a lost section has no true total.
    if (depth_[s] > 0) ++open_at_step_end_;
    if (calls_[s] == 0 || depth_[s] > 0 || lost_[s]) out.device_ms[s] = out.host_ms[s] = kNaN;
  }
  reset_step_state();
  return out;
}

}  // namespace relax_straggler::torch_ext
