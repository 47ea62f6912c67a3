// Kernel records of sampled steps through CUPTI's activity API (docs/DESIGN.md, "Kernel
// records (csrc/cupti/)").
//
// begin_sampled_step() subscribes to CUPTI, registers the buffer callbacks and enables the
// concurrent-kernel, memcpy and memset activity kinds; end_sampled_step() disables them,
// flushes CUPTI's buffers into a KernelStats (csrc/cupti/kernel_stats.h), releases the
// subscription and summarises the step's sections. Nothing is enabled outside sampled steps.
//
// Sections: end_sampled_step() takes the sections as time ranges on CUPTI's clock;
// end_observed_step() takes them from the stage timer itself. The collector is then the
// timer's section observer (section_observer(), csrc/cupti/section_observer.h): at each
// section begin and end of a sampled step it records the last correlation id issued in the
// process (kept from CUPTI's runtime and driver API callbacks, enabled on sampled steps only),
// and at the step's end each kernel record goes to the section whose id range holds its own
// (KernelStats::summarize_ids), its idle time measured against the timer's event time.
//
// Bounded: CUPTI gets a fixed pool of buffers allocated at construction; a request with none
// free is declined (CUPTI drops those records and counts them, cupti_dropped_records()). The
// section marks of a step go into a buffer of max_marks; a full one drops and counts them.
//
// Coexistence: CUPTI has one subscriber at a time. When another tool holds it (torch.profiler,
// Nsight Systems / Compute, cuda-gdb: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED), or the
// caller says a profiler is active, the collector backs off: it counts the refusal, warns once,
// reports "events only" and tries again after `retry_after` sampled steps. When CUPTI cannot
// start at all (no driver, no device) it is "unavailable" and calls CUPTI no more. Shutdown
// calls only what succeeded before, so it never fails without a driver.
//
// Threads: begin/end/shutdown from one thread (the training thread at step boundaries);
// CUPTI may deliver buffers on its own thread. One collector per process holds CUPTI's
// callbacks at a time; a second one backs off like any other tool.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cupti/kernel_stats.h"
#include "cupti/section_marks.h"
#include "cupti/section_observer.h"

namespace relax_straggler::cupti {

struct CollectorConfig {
  std::size_t buffer_bytes = std::size_t{4} << 20;  // each CUPTI buffer (>= 64 KiB, multiple of 8)
  std::size_t num_buffers = 4;                       // the pool lent to CUPTI
  std::size_t max_records = std::size_t{1} << 18;    // records kept per sampled step
  std::size_t max_marks = 8192;                      // section begin/end marks per sampled step
  std::int64_t retry_after = 50;                     // sampled steps to wait after a refusal (>= 0)
  // Receives each warning (at most one per kind per collector); default: stderr.
  std::function<void(const std::string&)> warn;
};

enum class CollectorMode {
  kKernels,     // the last sampled step had kernel records (or none tried yet)
  kEventsOnly,  // another tool holds CUPTI: stage times from CUDA events only, retried later
  kUnavailable  // CUPTI cannot run here; never retried
};

class CuptiCollector {
 public:
  // Allocates the buffer pool; calls nothing in CUPTI. Throws std::invalid_argument on a
  // bad size (buffer_bytes < 64 KiB or not a multiple of 8, num_buffers, max_records or
  // max_marks 0, retry_after < 0).
  explicit CuptiCollector(CollectorConfig config = {});
  ~CuptiCollector();
  CuptiCollector(const CuptiCollector&) = delete;
  CuptiCollector& operator=(const CuptiCollector&) = delete;

  // Starts collecting kernel records for this sampled step; returns false (events only)
  // when backing off, when CUPTI refuses or is unavailable, or when profiler_active (the
  // caller saw torch.profiler running). Never throws for CUPTI's answers.
  bool begin_sampled_step(bool profiler_active = false);

  // Ends the step begun by begin_sampled_step(): flushes CUPTI's records and summarises
  // them over `sections` (on CUPTI's clock and stream ids) with the top_k kernels of each.
  // std::nullopt when the step collected nothing (begin returned false, or the flush failed).
  std::optional<StepKernels> end_sampled_step(const std::vector<Section>& sections, std::size_t top_k);

  // Ends the step like end_sampled_step(), summarising the records over the sections this
  // collector observed (section_observer()) as correlation-id ranges. `timed`: the stage
  // timer's sections of the step in the order they ended with their event-measured device
  // ms (StageTimer::last_sections()), the idle time's reference.
  std::optional<StepKernels> end_observed_step(const std::vector<TimedSection>& timed, std::size_t top_k);

  // The stage timer's section observer feeding end_observed_step(): it records a mark only
  // between begin_sampled_step() (when it returned true) and the step's end, calls nothing
  // in CUPTI and takes one mutex. ctx is this collector, which must outlive the timer's use.
  SectionObserver section_observer();

  // Disables what is enabled, flushes every buffer back, unsubscribes and gives up CUPTI's
  // callbacks. Idempotent; the destructor calls it.
  void shutdown();

  CollectorMode mode() const { return mode_; }
  // "kernels", "events only" or "unavailable".
  const char* mode_name() const;
  // The last CUPTI error seen, with the call that returned it; empty when none.
  const std::string& last_error() const { return last_error_; }

  std::int64_t refusals() const { return refusals_; }  // sampled steps CUPTI (or a profiler) refused
  std::int64_t collected_steps() const { return collected_steps_; }
  std::int64_t cupti_dropped_records() const { return cupti_dropped_; }  // CUPTI had no buffer
  std::int64_t declined_buffer_requests() const { return declined_requests_.load(); }
  std::int64_t foreign_buffers() const { return foreign_buffers_.load(); }  // not ours: not read
  std::int64_t dropped_marks() const { return dropped_marks_; }      // section marks lost to a full buffer
  std::int64_t unmatched_marks() const { return unmatched_marks_; }  // a begin or an end without its partner

 private:
  friend struct CollectorCallbacks;  // CUPTI's buffer callbacks and the section observer (cupti_collector.cpp)

  bool ok(int result, const char* call);  // records a failure in last_error_
  void refuse(const std::string& why);    // back off for retry_after sampled steps
  void give_up(const std::string& why);   // unavailable from now on
  void warn_once(bool& warned, const std::string& message);
  bool claim();  // becomes the collector CUPTI's callbacks serve; false if another is
  bool start_collecting();
  bool stop_collecting();  // disable, flush; false when records were lost
  bool finish_step();      // stop_collecting() at a step's end; false when nothing to summarise
  void mark(int stage, bool begin);
  void stop_marking();
  void release_subscription();
  bool owns(const std::uint8_t* buffer) const;
  void lend(std::uint8_t** buffer, std::size_t* size);
  void take_back(std::uint8_t* buffer, std::size_t valid_bytes);

  const CollectorConfig config_;
  std::unique_ptr<std::uint8_t[]> storage_;  // num_buffers x buffer_bytes
  std::mutex pool_mu_;
  std::vector<std::uint8_t*> free_buffers_;  // capacity num_buffers
  std::mutex stats_mu_;
  KernelStats stats_;

  CollectorMode mode_ = CollectorMode::kKernels;
  void* subscriber_ = nullptr;  // CUpti_SubscriberHandle while subscribed
  bool owner_ = false;          // holds the process's CUPTI callbacks
  bool registered_ = false;     // our buffer callbacks registered with CUPTI
  int enabled_kinds_ = 0;       // activity kinds enabled, in kActivityKinds order
  int enabled_domains_ = 0;     // API callback domains enabled, in kApiDomains order
  bool collecting_ = false;
  std::int64_t backoff_left_ = 0;
  std::string last_error_;
  bool warned_refused_ = false;
  bool warned_unavailable_ = false;
  bool warned_lost_ = false;

  std::int64_t refusals_ = 0;
  std::int64_t collected_steps_ = 0;
  std::int64_t cupti_dropped_ = 0;
  std::atomic<std::int64_t> declined_requests_{0};
  std::atomic<std::int64_t> foreign_buffers_{0};

  std::mutex marks_mu_;  // the observer may run on any thread that opens or closes a section
  SectionMarks marks_;
  bool marking_ = false;
  std::int64_t dropped_marks_ = 0;
  std::int64_t unmatched_marks_ = 0;
};

}  // namespace relax_straggler::cupti
