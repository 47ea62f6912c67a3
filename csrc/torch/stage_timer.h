// Sampled per-stage timing for one rank (docs/ARCHITECTURE.md invariants 2, 3 and 8).
//
// begin_step(step) decides whether the step is sampled (step >= warmup_steps and
// step % interval == 0). Only on sampled steps do the recording methods touch the event
// pool, a fixed number of slots reused every sampled step; on other steps they return
// after one relaxed atomic load. end_step() is the single read point of a step.
//
// Three things are recorded, all as pairs of events on one timeline:
//   sections     start(stage)/stop(stage). Re-entering an open stage is timed once, by
//                the outermost pair; repeated entries (microbatches) accumulate.
//   collectives  comm_begin()/comm_end() from the collective wrapper (TimedBackend);
//                comm_end may come from a communication thread.
//   waits        wait_begin()/wait_end(): the training thread blocked on a collective.
//                The part of a section covered by waits is reported as waited_ms, so
//                compute time = device_ms - waited_ms.
//
// A section observer (csrc/cupti/section_observer.h; the kernel-record collector of
// relax_straggler._core) may be told where each timed section begins and ends: on sampled
// steps only, right after the section's event is recorded. None set: one branch per section.
//
// Thread safety: every method may be called from any thread (backward hooks run on
// autograd worker threads, completion callbacks on communication threads); a mutex
// guards the sampled-step state and is never taken on non-sampled steps.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "comm_op.h"
#include "cupti/section_observer.h"
#include "event_pool.h"

namespace relax_straggler::torch_ext {

// What one rank measured in one sampled step. Stage vectors are indexed by stage id,
// collective vectors by CommOp. Times in ms; NaN where a stage did not run or lost a
// section to a full pool.
struct StepSample {
  std::int64_t step = -1;
  bool sampled = false;
  std::vector<double> device_ms;
  std::vector<double> host_ms;        // host wall clock, same convention
  std::vector<double> waited_ms;      // part of device_ms spent blocked on collectives
  std::vector<std::int64_t> calls;    // completed outermost sections per stage
  std::vector<double> comm_op_ms;     // summed durations of completed collectives
  std::vector<std::int64_t> comm_op_calls;
  std::vector<std::int64_t> comm_op_bytes;  // summed input bytes
  double comm_total_ms = 0.0;         // wall time with at least one collective in flight
  double wait_total_ms = 0.0;         // wall time the training thread was blocked on one
  // Durations of the first kMaxComparableCollectives completed collectives issued on
  // groups spanning every analyzed rank, in issue order (comparable across ranks).
  std::vector<double> comparable_ms;
  std::int64_t comm_incomplete = 0;   // issued this step, not finished at its end
  // Host wall time from begin_step to end_step outside every timed section, collective and
  // wait (the union of their host spans taken out): the rank's own code between sections.
  // NaN when a section was lost to a full pool (its span is unknown).
  double untimed_ms = std::numeric_limits<double>::quiet_NaN();
};

class StageTimer {
 public:
  // num_stages: stage ids are 0..num_stages-1. interval >= 1 and warmup_steps >= 0.
  // max_events bounds the pool (two per section, collective or wait). use_cuda needs a
  // WITH_CUDA build. Throws std::invalid_argument on bad arguments.
  StageTimer(int num_stages, std::int64_t interval, std::int64_t warmup_steps, std::size_t max_events, bool use_cuda);

  // Starts step `step`; returns whether it is sampled. Discards a step left open.
  bool begin_step(std::int64_t step);
  bool sampled() const { return sampled_.load(std::memory_order_relaxed); }

  void start(int stage);
  void stop(int stage);

  // Returns a token for comm_end, or -1 when the step is not sampled or the pool is full.
  // comparable: issued on a group that spans every analyzed rank; bytes: input size.
  std::int64_t comm_begin(CommOp op, bool comparable, std::int64_t bytes);
  // Marks the collective done. blocking: the caller was blocked for the whole
  // collective (a synchronous call), so its interval is also a wait.
  void comm_end(std::int64_t token, bool blocking = false);
  std::int64_t wait_begin();
  void wait_end(std::int64_t token);

  // Closes the current step and reads its events (one synchronize). A non-sampled step
  // returns a sample with sampled == false and reads nothing.
  StepSample end_step();

  // Calls observer.fn(ctx, stage, 1) after recording the start of each section this timer
  // times and observer.fn(ctx, stage, 0) after its end, on sampled steps only (not for a
  // section lost to a full pool, nor for re-entries); fn == nullptr clears it. The caller
  // keeps ctx alive while it is set.
  void set_section_observer(SectionObserver observer);
  bool has_section_observer();
  // The sections completed in the last sampled step end_step() read, in the order they ended
  // (the observer's ends): (stage id, device ms).
  std::vector<std::pair<int, double>> last_sections();

  int num_stages() const { return num_stages_; }
  std::int64_t interval() const { return interval_; }
  // Samples every `interval`-th step from the next begin_step on (runtime control; every
  // rank switches at the same step). Throws std::invalid_argument when interval < 1.
  void set_interval(std::int64_t interval);
  const char* device() const { return pool_->device(); }

  // Counters for the overhead proof and for reporting every loss (lifetime totals).
  std::int64_t read_points() const { return read_points_; }
  std::int64_t events_recorded() const { return events_recorded_; }
  std::int64_t dropped_sections() const { return dropped_sections_; }  // pool exhausted
  std::int64_t dropped_collectives() const { return dropped_collectives_; }
  std::int64_t unmatched_stops() const { return unmatched_stops_; }
  std::int64_t open_at_step_end() const { return open_at_step_end_; }

 private:
  struct Pair {
    int stage;  // section stage, or the CommOp for collectives, -1 for waits
    std::size_t start_slot;
    std::size_t end_slot;
    bool ended;
    bool comparable;
    std::int64_t bytes;
    // Host clock of its start and end (ns), for the step's untimed time.
    std::int64_t host_begin_ns = 0;
    std::int64_t host_end_ns = 0;
  };

  void check_stage(int stage) const;
  void reset_step_state();
  bool reserve_pair(std::size_t& start_slot);  // both slots; false when the pool is full
  std::int64_t token_of(std::size_t index) const;
  Pair* pair_of(std::vector<Pair>& pairs, std::int64_t token);
  // A collective or wait pair: open records its start (sampled steps, pool permitting)
  // and returns its token or -1; close records its end (caller holds mu_).
  std::int64_t open_pair(std::vector<Pair>& pairs, int kind, bool comparable, std::int64_t bytes);
  Pair* close_pair(std::vector<Pair>& pairs, std::int64_t token);
  void record(std::size_t slot);
  double offset_ms(std::size_t slot);  // from the step's first event (valid in end_step)
  double untimed_ms(std::int64_t end_ns) const;  // StepSample::untimed_ms (caller holds mu_)

  const int num_stages_;
  std::int64_t interval_;  // guarded by mu_ (read by begin_step, written by set_interval)
  const std::int64_t warmup_steps_;
  std::unique_ptr<EventPool> pool_;

  std::atomic<bool> sampled_{false};
  std::mutex mu_;
  std::int64_t step_ = -1;
  std::int64_t step_begin_ns_ = 0;  // host clock of a sampled step's begin_step
  std::uint32_t generation_ = 0;  // tells a late comm_end/wait_end from an earlier step
  std::size_t next_slot_ = 0;
  std::vector<int> depth_;                    // open nesting depth per stage
  std::vector<std::size_t> open_slot_;        // start slot of the outermost open section
  std::vector<std::int64_t> host_start_ns_;   // host start of the outermost open section
  std::vector<double> host_ms_;
  std::vector<std::int64_t> calls_;
  std::vector<bool> lost_;                    // a section of this stage was dropped
  std::vector<Pair> sections_;
  std::vector<Pair> comms_;
  std::vector<Pair> waits_;
  SectionObserver observer_;                        // guarded by mu_
  std::vector<std::pair<int, double>> last_sections_;  // capacity max_events / 2

  std::int64_t read_points_ = 0;
  std::int64_t events_recorded_ = 0;
  std::int64_t dropped_sections_ = 0;
  std::int64_t dropped_collectives_ = 0;
  std::int64_t unmatched_stops_ = 0;
  std::int64_t open_at_step_end_ = 0;
};

}  // namespace relax_straggler::torch_ext
