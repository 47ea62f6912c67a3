#include "stage_timer.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/intervals.h"

namespace relax_straggler::torch_ext {
namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr std::size_t kNoSlot = static_cast<std::size_t>(-1);
using core::Interval;
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
  sections_.reserve(max_events / 2);
  last_sections_.reserve(max_events / 2);
}

void StageTimer::check_stage(int stage) const {
  if (stage < 0 || stage >= num_stages_) {
    throw std::out_of_range("stage id " + std::to_string(stage) + " out of range [0, " + std::to_string(num_stages_) +
                            ")");
  }
}

void StageTimer::reset_step_state() {
  ++generation_;
  next_slot_ = 0;
  sections_.clear();
  comms_.clear();
  waits_.clear();
  std::fill(depth_.begin(), depth_.end(), 0);
  std::fill(open_slot_.begin(), open_slot_.end(), kNoSlot);
  std::fill(host_ms_.begin(), host_ms_.end(), 0.0);
  std::fill(calls_.begin(), calls_.end(), 0);
  std::fill(lost_.begin(), lost_.end(), false);
}

bool StageTimer::reserve_pair(std::size_t& start_slot) {
  if (next_slot_ + 2 > pool_->capacity()) return false;
  start_slot = next_slot_;
  next_slot_ += 2;  // the end slot is held until the pair ends
  return true;
}

void StageTimer::record(std::size_t slot) {
  pool_->record(slot);
  ++events_recorded_;
}

std::int64_t StageTimer::token_of(std::size_t index) const {
  return static_cast<std::int64_t>((static_cast<std::uint64_t>(generation_) << 32) | index);
}

StageTimer::Pair* StageTimer::pair_of(std::vector<Pair>& pairs, std::int64_t token) {
  if (token < 0) return nullptr;
  const auto t = static_cast<std::uint64_t>(token);
  const auto index = static_cast<std::size_t>(t & 0xffffffffu);
  if ((t >> 32) != generation_ || index >= pairs.size() || pairs[index].ended) return nullptr;
  return &pairs[index];
}

void StageTimer::set_section_observer(SectionObserver observer) {
  std::lock_guard<std::mutex> lock(mu_);
  observer_ = observer.fn != nullptr ? observer : SectionObserver{};
}

bool StageTimer::has_section_observer() {
  std::lock_guard<std::mutex> lock(mu_);
  return observer_.fn != nullptr;
}

std::vector<std::pair<int, double>> StageTimer::last_sections() {
  std::lock_guard<std::mutex> lock(mu_);
  return last_sections_;
}

void StageTimer::set_interval(std::int64_t interval) {
  if (interval < 1) throw std::invalid_argument("interval must be >= 1, got " + std::to_string(interval));
  std::lock_guard<std::mutex> lock(mu_);
  interval_ = interval;
}

bool StageTimer::begin_step(std::int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  reset_step_state();
  step_ = step;
  const bool sampled = step >= warmup_steps_ && step % interval_ == 0;
  if (sampled) step_begin_ns_ = HostEventPool::now_ns();
  sampled_.store(sampled, std::memory_order_relaxed);
  return sampled;
}

void StageTimer::start(int stage) {
  if (!sampled_.load(std::memory_order_relaxed)) return;
  check_stage(stage);
  std::lock_guard<std::mutex> lock(mu_);
  const auto s = static_cast<std::size_t>(stage);
  if (depth_[s]++ > 0) return;  // nested re-entry: the outermost section times it
  std::size_t slot = kNoSlot;
  if (!reserve_pair(slot)) {
    lost_[s] = true;  // said at read time: the stage has no true total this step
    ++dropped_sections_;
  } else {
    host_start_ns_[s] = HostEventPool::now_ns();
    record(slot);
    if (observer_.fn != nullptr) observer_.fn(observer_.ctx, stage, 1);
  }
  open_slot_[s] = slot;
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
  if (--depth_[s] > 0 || open_slot_[s] == kNoSlot) return;
  record(open_slot_[s] + 1);
  if (observer_.fn != nullptr) observer_.fn(observer_.ctx, stage, 0);
  const std::int64_t now = HostEventPool::now_ns();
  host_ms_[s] += static_cast<double>(now - host_start_ns_[s]) * 1e-6;
  ++calls_[s];
  sections_.push_back(Pair{stage, open_slot_[s], open_slot_[s] + 1, true, false, 0, host_start_ns_[s], now});
  open_slot_[s] = kNoSlot;
}

std::int64_t StageTimer::open_pair(std::vector<Pair>& pairs, int kind, bool comparable, std::int64_t bytes) {
  if (!sampled_.load(std::memory_order_relaxed)) return -1;
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t slot = kNoSlot;
  if (!reserve_pair(slot)) {
    ++dropped_collectives_;
    return -1;
  }
  record(slot);
  pairs.push_back(Pair{kind, slot, slot + 1, false, comparable, bytes, HostEventPool::now_ns(), 0});
  return token_of(pairs.size() - 1);
}

StageTimer::Pair* StageTimer::close_pair(std::vector<Pair>& pairs, std::int64_t token) {
  Pair* p = pair_of(pairs, token);
  if (p == nullptr) return nullptr;  // not recorded, already ended, or from an earlier step
  record(p->end_slot);
  p->ended = true;
  p->host_end_ns = HostEventPool::now_ns();
  return p;
}

std::int64_t StageTimer::comm_begin(CommOp op, bool comparable, std::int64_t bytes) {
  return open_pair(comms_, static_cast<int>(op), comparable, bytes);
}

void StageTimer::comm_end(std::int64_t token, bool blocking) {
  std::lock_guard<std::mutex> lock(mu_);
  const Pair* p = close_pair(comms_, token);
  if (p != nullptr && blocking) {
    waits_.push_back(Pair{-1, p->start_slot, p->end_slot, true, false, 0, p->host_begin_ns, p->host_end_ns});
  }
}

std::int64_t StageTimer::wait_begin() { return open_pair(waits_, -1, false, 0); }

void StageTimer::wait_end(std::int64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  close_pair(waits_, token);
}

double StageTimer::offset_ms(std::size_t slot) { return pool_->elapsed_ms(0, slot); }

double StageTimer::untimed_ms(std::int64_t end_ns) const {
  // On the host clock whatever the pool's: the training thread's own time, which a device
  // timeline does not show. Sections, collectives and waits still open end now.
  if (std::find(lost_.begin(), lost_.end(), true) != lost_.end()) return kNaN;
  const auto ms = [&](std::int64_t ns) {
    return static_cast<double>(std::clamp(ns, step_begin_ns_, end_ns) - step_begin_ns_) * 1e-6;
  };
  std::vector<Interval> spans;
  spans.reserve(sections_.size() + comms_.size() + waits_.size() + depth_.size());
  for (const std::vector<Pair>* pairs : {&sections_, &comms_, &waits_}) {
    for (const Pair& p : *pairs) spans.push_back(Interval{ms(p.host_begin_ns), ms(p.ended ? p.host_end_ns : end_ns)});
  }
  for (std::size_t s = 0; s < depth_.size(); ++s) {
    if (depth_[s] > 0 && open_slot_[s] != kNoSlot) spans.push_back(Interval{ms(host_start_ns_[s]), ms(end_ns)});
  }
  return std::max(ms(end_ns) - core::union_ms(std::move(spans)), 0.0);
}

StepSample StageTimer::end_step() {
  std::lock_guard<std::mutex> lock(mu_);
  StepSample out;
  out.step = step_;
  out.sampled = sampled_.load(std::memory_order_relaxed);
  sampled_.store(false, std::memory_order_relaxed);
  if (!out.sampled) return out;
  out.untimed_ms = untimed_ms(HostEventPool::now_ns());

  pool_->synchronize();
  ++read_points_;
  const auto n = static_cast<std::size_t>(num_stages_);

  std::vector<Interval> waits;
  for (const Pair& w : waits_) {
    if (w.ended) waits.push_back(Interval{offset_ms(w.start_slot), offset_ms(w.end_slot)});
  }
  out.wait_total_ms = core::union_ms(waits);
  const std::vector<Interval> merged_waits = core::merge_intervals(std::move(waits));

  out.device_ms.assign(n, 0.0);
  out.waited_ms.assign(n, 0.0);
  last_sections_.clear();
  for (const Pair& p : sections_) {
    const Interval x{offset_ms(p.start_slot), offset_ms(p.end_slot)};
    const auto s = static_cast<std::size_t>(p.stage);
    out.device_ms[s] += x.end_ms - x.begin_ms;
    last_sections_.emplace_back(p.stage, x.end_ms - x.begin_ms);
    out.waited_ms[s] += core::covered_ms(x, merged_waits);
  }
  out.host_ms = host_ms_;
  out.calls = calls_;
  for (std::size_t s = 0; s < n; ++s) {
    // A stage still open at the step end or one that lost a section has no true total.
    if (depth_[s] > 0) ++open_at_step_end_;
    if (calls_[s] == 0 || depth_[s] > 0 || lost_[s]) out.device_ms[s] = out.host_ms[s] = out.waited_ms[s] = kNaN;
  }

  out.comm_op_ms.assign(kNumCommOps, 0.0);
  out.comm_op_calls.assign(kNumCommOps, 0);
  out.comm_op_bytes.assign(kNumCommOps, 0);
  std::vector<Interval> comms;
  for (const Pair& c : comms_) {  // issue order
    if (!c.ended) {
      ++out.comm_incomplete;
      continue;
    }
    const Interval x{offset_ms(c.start_slot), offset_ms(c.end_slot)};
    const auto op = static_cast<std::size_t>(c.stage);
    out.comm_op_ms[op] += x.end_ms - x.begin_ms;
    ++out.comm_op_calls[op];
    out.comm_op_bytes[op] += c.bytes;
    if (c.comparable && out.comparable_ms.size() < kMaxComparableCollectives) {
      out.comparable_ms.push_back(x.end_ms - x.begin_ms);
    }
    comms.push_back(x);
  }
  out.comm_total_ms = core::union_ms(std::move(comms));
  reset_step_state();
  return out;
}

}  // namespace relax_straggler::torch_ext
