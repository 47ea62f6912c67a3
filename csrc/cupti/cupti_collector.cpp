#include "cupti/cupti_collector.h"

#include <cupti.h>

#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <utility>

namespace relax_straggler::cupti {
namespace {

constexpr CUpti_ActivityKind kActivityKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                                 CUPTI_ACTIVITY_KIND_MEMSET};
constexpr CUpti_CallbackDomain kApiDomains[] = {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_CB_DOMAIN_DRIVER_API};
constexpr std::size_t kMinBufferBytes = std::size_t{64} << 10;

// The last correlation id issued in the process as far as CUPTI's API callbacks have told
// (runtime and driver calls on every thread, while a collector has them enabled). CUPTI 13
// has no query for it; ids are issued in order process-wide, so this is each section mark's
// bound whichever thread launched the section's work.
std::atomic<std::uint32_t> g_last_id{0};

// The collector CUPTI's buffer callbacks serve. A callback holds the mutex while it uses the
// collector, so shutdown(), which clears the pointer under it, never races one in flight.
// No CUPTI call is made with it held (a flush runs the callbacks on the calling thread).
std::mutex g_owner_mu;
CuptiCollector* g_owner = nullptr;

std::string result_name(CUptiResult result) {
  const char* s = nullptr;
  if (cuptiGetResultString(result, &s) == CUPTI_SUCCESS && s != nullptr) return s;
  return "CUPTI error " + std::to_string(static_cast<int>(result));
}

// The subscription claims CUPTI (one subscriber at a time); on sampled steps its runtime and
// driver API domains are enabled and every call's entry raises g_last_id.
void CUPTIAPI api_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
  const auto* call = static_cast<const CUpti_CallbackData*>(data);
  if (call != nullptr && call->callbackSite == CUPTI_API_ENTER) advance_last_id(g_last_id, call->correlationId);
}

// The fields KernelStats reads, from the record versions of the CUPTI these headers belong to.
bool to_record(const CUpti_Activity* a, ActivityRecord& r) {
  switch (a->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(a);
      r = {ActivityKind::kKernel, k->start, k->end, k->streamId, k->correlationId, k->name};
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(a);
      r = {ActivityKind::kMemcpy, m->start, m->end, m->streamId, m->correlationId, nullptr};
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(a);
      r = {ActivityKind::kMemset, m->start, m->end, m->streamId, m->correlationId, nullptr};
      return true;
    }
    default:
      return false;
  }
}

CollectorConfig validated(CollectorConfig c) {
  if (c.buffer_bytes < kMinBufferBytes || c.buffer_bytes % 8 != 0 || c.num_buffers == 0 || c.max_records == 0 ||
      c.max_marks == 0 || c.retry_after < 0) {
    throw std::invalid_argument(
        "CuptiCollector: buffer_bytes must be >= 65536 and a multiple of 8, num_buffers, max_records and "
        "max_marks > 0, retry_after >= 0 (got buffer_bytes=" +
        std::to_string(c.buffer_bytes) + ", num_buffers=" + std::to_string(c.num_buffers) +
        ", max_records=" + std::to_string(c.max_records) + ", max_marks=" + std::to_string(c.max_marks) +
        ", retry_after=" + std::to_string(c.retry_after) + ")");
  }
  return c;
}

}  // namespace

struct CollectorCallbacks {
  static void CUPTIAPI requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
    *buffer = nullptr;  // declined unless a collector lends one
    *size = 0;
    *max_records = 0;  // as many as fit
    std::lock_guard<std::mutex> lock(g_owner_mu);
    if (g_owner != nullptr) g_owner->lend(buffer, size);
  }
  static void CUPTIAPI completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t, std::size_t valid) {
    std::lock_guard<std::mutex> lock(g_owner_mu);
    if (g_owner != nullptr) g_owner->take_back(buffer, valid);
  }
  static void section(void* ctx, int stage, int begin) {
    static_cast<CuptiCollector*>(ctx)->mark(stage, begin != 0);
  }
};

CuptiCollector::CuptiCollector(CollectorConfig config)
    : config_(validated(std::move(config))),
      storage_(std::make_unique<std::uint8_t[]>(config_.buffer_bytes * config_.num_buffers)),
      stats_(config_.max_records),
      marks_(config_.max_marks) {
  free_buffers_.reserve(config_.num_buffers);
  for (std::size_t i = 0; i < config_.num_buffers; ++i) {
    free_buffers_.push_back(storage_.get() + i * config_.buffer_bytes);
  }
}

CuptiCollector::~CuptiCollector() { shutdown(); }

const char* CuptiCollector::mode_name() const {
  switch (mode_) {
    case CollectorMode::kKernels:
      return "kernels";
    case CollectorMode::kEventsOnly:
      return "events only";
    case CollectorMode::kUnavailable:
      return "unavailable";
  }
  return "unavailable";
}

bool CuptiCollector::ok(int result, const char* call) {
  if (result == CUPTI_SUCCESS) return true;
  last_error_ = std::string(call) + ": " + result_name(static_cast<CUptiResult>(result));
  return false;
}

void CuptiCollector::warn_once(bool& warned, const std::string& message) {
  if (warned) return;
  warned = true;
  if (config_.warn) {
    config_.warn(message);
  } else {
    std::fprintf(stderr, "%s\n", message.c_str());
  }
}

void CuptiCollector::refuse(const std::string& why) {
  ++refusals_;
  mode_ = CollectorMode::kEventsOnly;
  backoff_left_ = config_.retry_after;
  warn_once(warned_refused_, "relax_straggler: no kernel records (" + why +
                                 "); stage times come from CUDA events only; retrying every " +
                                 std::to_string(config_.retry_after + 1) + " sampled steps");
}

void CuptiCollector::give_up(const std::string& why) {
  mode_ = CollectorMode::kUnavailable;
  warn_once(warned_unavailable_, "relax_straggler: CUPTI unavailable (" + why +
                                     "); stage times come from CUDA events only");
}

bool CuptiCollector::claim() {
  std::lock_guard<std::mutex> lock(g_owner_mu);
  if (g_owner == nullptr) g_owner = this;
  owner_ = g_owner == this;
  return owner_;
}

bool CuptiCollector::begin_sampled_step(bool profiler_active) {
  if (collecting_) stop_collecting();  // a step left open: its records are discarded below
  if (mode_ == CollectorMode::kUnavailable) return false;
  if (backoff_left_ > 0) {
    --backoff_left_;
    return false;
  }
  if (profiler_active) {
    refuse("a profiler is active");
    return false;
  }
  if (!start_collecting()) return false;
  mode_ = CollectorMode::kKernels;
  std::lock_guard<std::mutex> lock(marks_mu_);
  marks_.clear();
  marking_ = true;
  return true;
}

bool CuptiCollector::start_collecting() {
  if (!claim()) {
    refuse("another collector in this process holds CUPTI");
    return false;
  }
  CUpti_SubscriberHandle subscriber = nullptr;
  const CUptiResult subscribed = cuptiSubscribe(&subscriber, api_callback, nullptr);
  if (subscribed == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
    ok(subscribed, "cuptiSubscribe");
    refuse("another tool holds CUPTI: torch.profiler, Nsight or cuda-gdb");
    return false;
  }
  if (!ok(subscribed, "cuptiSubscribe")) {
    // Never started: CUPTI cannot run here (no driver, no device). Once it has run, a
    // failure is taken as passing.
    if (registered_) {
      refuse(last_error_);
    } else {
      give_up(last_error_);
    }
    return false;
  }
  subscriber_ = subscriber;
  // Registered every sampled step: another tool may have put its own callbacks in between.
  if (!ok(cuptiActivityRegisterCallbacks(CollectorCallbacks::requested, CollectorCallbacks::completed),
          "cuptiActivityRegisterCallbacks")) {
    release_subscription();
    refuse(last_error_);
    return false;
  }
  registered_ = true;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.clear();
  }
  for (CUpti_CallbackDomain domain : kApiDomains) {
    if (!ok(cuptiEnableDomain(1, subscriber, domain), "cuptiEnableDomain")) {
      stop_collecting();
      refuse(last_error_);
      return false;
    }
    ++enabled_domains_;
  }
  for (CUpti_ActivityKind kind : kActivityKinds) {
    if (!ok(cuptiActivityEnable(kind), "cuptiActivityEnable")) {
      stop_collecting();
      refuse(last_error_);
      return false;
    }
    ++enabled_kinds_;
  }
  collecting_ = true;
  return true;
}

bool CuptiCollector::stop_collecting() {
  stop_marking();
  bool fine = true;
  while (enabled_kinds_ > 0) {
    --enabled_kinds_;
    fine = ok(cuptiActivityDisable(kActivityKinds[enabled_kinds_]), "cuptiActivityDisable") && fine;
  }
  while (enabled_domains_ > 0) {
    --enabled_domains_;
    fine = ok(cuptiEnableDomain(0, static_cast<CUpti_SubscriberHandle>(subscriber_), kApiDomains[enabled_domains_]),
              "cuptiEnableDomain") &&
           fine;
  }
  // Completed records only: the stage timer's end-of-step read has waited for the step's
  // work; records still incomplete come with a later flush (outside every section then).
  fine = ok(cuptiActivityFlushAll(0), "cuptiActivityFlushAll") && fine;
  std::size_t dropped = 0;
  if (ok(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped), "cuptiActivityGetNumDroppedRecords")) {
    cupti_dropped_ += static_cast<std::int64_t>(dropped);
  }
  release_subscription();
  collecting_ = false;
  return fine;
}

void CuptiCollector::release_subscription() {
  if (subscriber_ == nullptr) return;
  ok(cuptiUnsubscribe(static_cast<CUpti_SubscriberHandle>(subscriber_)), "cuptiUnsubscribe");
  subscriber_ = nullptr;
}

bool CuptiCollector::finish_step() {
  if (!collecting_) return false;
  if (!stop_collecting()) {
    warn_once(warned_lost_, "relax_straggler: kernel records of a sampled step lost (" + last_error_ + ")");
    refuse(last_error_);
    return false;
  }
  ++collected_steps_;
  return true;
}

std::optional<StepKernels> CuptiCollector::end_sampled_step(const std::vector<Section>& sections,
                                                            std::size_t top_k) {
  if (!finish_step()) return std::nullopt;
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_.summarize(sections, top_k);
}

std::optional<StepKernels> CuptiCollector::end_observed_step(const std::vector<TimedSection>& timed,
                                                             std::size_t top_k) {
  std::vector<IdSection> sections;
  {
    std::lock_guard<std::mutex> lock(marks_mu_);
    if (marking_) {
      marking_ = false;
      sections = marks_.sections(timed);
      dropped_marks_ += marks_.dropped();
      unmatched_marks_ += marks_.unmatched();
    }
  }
  if (!finish_step()) return std::nullopt;
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_.summarize_ids(sections, top_k);
}

SectionObserver CuptiCollector::section_observer() { return {&CollectorCallbacks::section, this}; }

void CuptiCollector::mark(int stage, bool begin) {
  std::lock_guard<std::mutex> lock(marks_mu_);
  if (marking_) marks_.mark(stage, begin, g_last_id.load(std::memory_order_relaxed));
}

void CuptiCollector::stop_marking() {
  std::lock_guard<std::mutex> lock(marks_mu_);
  marking_ = false;
}

void CuptiCollector::shutdown() {
  if (collecting_) stop_collecting();
  // Every buffer back, incomplete records too, so that CUPTI holds none of ours.
  if (registered_) ok(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  release_subscription();
  if (owner_) {
    std::lock_guard<std::mutex> lock(g_owner_mu);
    if (g_owner == this) g_owner = nullptr;
    owner_ = false;
  }
  registered_ = false;
  mode_ = CollectorMode::kUnavailable;
  std::size_t lent = 0;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    lent = config_.num_buffers - free_buffers_.size();
  }
  if (lent > 0 && storage_ != nullptr) {
    // CUPTI may still write into a buffer it did not give back: leave the memory to it.
    static_cast<void>(storage_.release());
    warn_once(warned_lost_, "relax_straggler: " + std::to_string(lent) +
                                " CUPTI buffers not returned at shutdown (" + last_error_ + "); left allocated");
  }
}

bool CuptiCollector::owns(const std::uint8_t* buffer) const {
  const std::uint8_t* base = storage_.get();
  if (base == nullptr || buffer < base || buffer >= base + config_.buffer_bytes * config_.num_buffers) return false;
  return static_cast<std::size_t>(buffer - base) % config_.buffer_bytes == 0;
}

void CuptiCollector::lend(std::uint8_t** buffer, std::size_t* size) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  if (free_buffers_.empty()) {
    ++declined_requests_;
    return;
  }
  *buffer = free_buffers_.back();
  *size = config_.buffer_bytes;
  free_buffers_.pop_back();
}

void CuptiCollector::take_back(std::uint8_t* buffer, std::size_t valid_bytes) {
  if (!owns(buffer)) {  // another tool's buffer, delivered to our callbacks: not ours to read or free
    ++foreign_buffers_;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    CUpti_Activity* a = nullptr;
    ActivityRecord r;
    // Ends with CUPTI_ERROR_MAX_LIMIT_REACHED after the last record.
    while (valid_bytes > 0 && cuptiActivityGetNextRecord(buffer, valid_bytes, &a) == CUPTI_SUCCESS) {
      if (to_record(a, r)) stats_.add(r);
    }
  }
  std::lock_guard<std::mutex> lock(pool_mu_);
  free_buffers_.push_back(buffer);
}

}  // namespace relax_straggler::cupti
