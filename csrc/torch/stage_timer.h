// Sampled per-stage timing for one rank (ARCHITECTURE.md invariants 2 and 3).
//
// begin_step(step) decides whether the step is sampled (step >= warmup_steps and
// step % interval == 0). Only on sampled steps do start()/stop() record events, from a
// pool of fixed size that is reused every sampled step; on other steps they return
// after one relaxed atomic load. Sections nest: re-entering a stage that is already open
// (recursion, nested modules) is counted once, by its outermost pair. The same stage
// entered several times in a step (microbatches) accumulates. Nothing synchronizes
// inside the step: end_step() is the single read point.
//
// Thread safety: start/stop may be called from autograd worker threads (backward
// hooks on CUDA run there); a mutex guards the sampled-step state.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "event_pool.h"

namespace relax_straggler::torch_ext {

// What one rank measured in one sampled step, per stage (index = stage id).
struct StepSample {
  std::int64_t step = -1;
  bool sampled = false;
  std::vector<double> device_ms;  // NaN where the stage did not run or a section was lost
  std::vector<double> host_ms;    // host wall clock, same convention
  std::vector<std::int64_t> calls;  // completed outermost sections per stage
};

class StageTimer {
 public:
  // num_stages: stage ids are 0..num_stages-1. interval >= 1 and warmup_steps >= 0.
  // max_events bounds the pool (two per section). use_cuda needs a WITH_CUDA build.
  // Throws std::invalid_argument on bad arguments.
  StageTimer(int num_stages, std::int64_t interval, std::int64_t warmup_steps, std::size_t max_events, bool use_cuda);

  // Starts step `step`; returns whether it is sampled. Discards a step left open.
  bool begin_step(std::int64_t step);
  bool sampled() const { return sampled_.load(std::memory_order_relaxed); }

  void start(int stage);
  void stop(int stage);

  // Closes the current step and reads its events (one synchronize). A non-sampled step
  // returns a sample with sampled == false and reads nothing.
  StepSample end_step();

  int num_stages() const { return num_stages_; }
  std::int64_t interval() const { return interval_; }
  const char* device() const { return pool_->device(); }

  // Counters for the overhead proof and for reporting every loss.
  std::int64_t read_points() const { return read_points_; }         // end_step reads done
  std::int64_t events_recorded() const { return events_recorded_; }  // lifetime
  std::int64_t dropped_sections() const { return dropped_sections_; }  // pool exhausted
  std::int64_t unmatched_stops() const { return unmatched_stops_; }    // stop without start
  std::int64_t open_at_step_end() const { return open_at_step_end_; }  // start without stop

 private:
  struct Pair {
    int stage;
    std::size_t start_slot;
    std::size_t end_slot;
  };

  void check_stage(int stage) const;
  void reset_step_state();

  const int num_stages_;
  const std::int64_t interval_;
  const std::int64_t warmup_steps_;
  std::unique_ptr<EventPool> pool_;

  std::atomic<bool> sampled_{false};
  std::mutex mu_;
  std::int64_t step_ = -1;
  std::size_t next_slot_ = 0;
  std::size_t open_sections_ = 0;  // sections holding an end slot
  std::vector<int> depth_;                  // open nesting depth per stage
  std::vector<std::size_t> open_slot_;      // start slot of the outermost open section
  std::vector<std::int64_t> host_start_ns_;  // host start of the outermost open section
  std::vector<double> host_ms_;
  std::vector<std::int64_t> calls_;
  std::vector<bool> lost_;                  // a section of this stage was dropped this step
  std::vector<Pair> pairs_;

  std::int64_t read_points_ = 0;
  std::int64_t events_recorded_ = 0;
  std::int64_t dropped_sections_ = 0;
  std::int64_t unmatched_stops_ = 0;
  std::int64_t open_at_step_end_ = 0;
};

}  // namespace relax_straggler::torch_ext
