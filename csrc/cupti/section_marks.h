// The correlation-id bounds of a sampled step's stage sections (docs/DESIGN.md, "Kernel
// records").
//
// The stage timer calls its section observer (csrc/cupti/section_observer.h) where each
// section it times begins and ends; the observer reads the last correlation id issued so far
// and records (stage, begin or end, id) here. At the step's end the marks become
// KernelStats::summarize_ids()'s IdSections: a kernel launched between a section's begin and
// end carries an id in (begin id, end id], wherever and whenever it ran.
//
// Bounded: the marks of a step go into a buffer sized at construction; mark() never
// allocates, and a full buffer drops the mark and counts it. Header only, plain C++17 (no
// CUDA headers). Not thread-safe: the caller serialises mark() and sections().
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "cupti/kernel_stats.h"

namespace relax_straggler::cupti {

// Raises `last` to `id` when id was issued after it (modulo 2^32; 0 = none yet): the
// process-wide last correlation id, fed from API callbacks on any thread.
inline void advance_last_id(std::atomic<std::uint32_t>& last, std::uint32_t id) {
  std::uint32_t seen = last.load(std::memory_order_relaxed);
  while ((seen == 0 || id_before(seen, id)) &&
         !last.compare_exchange_weak(seen, id, std::memory_order_relaxed)) {
  }
}

// The stage timer's device time of one section: its k-th completed section of the step.
struct TimedSection {
  int stage = 0;
  double device_ms = std::numeric_limits<double>::quiet_NaN();
};

class SectionMarks {
 public:
  struct Mark {
    int stage;
    bool begin;
    std::uint32_t id;  // after raising to the previous mark's
  };

  // capacity: marks kept per step (two per section). Throws std::invalid_argument when 0.
  explicit SectionMarks(std::size_t capacity) : capacity_(capacity) {
    if (capacity == 0) throw std::invalid_argument("SectionMarks: capacity must be > 0");
    marks_.reserve(capacity);
  }

  // Starts a step: forgets the marks and the step's counts. The id floor is kept: ids only grow.
  void clear() {
    marks_.clear();
    dropped_ = 0;
  }

  // Records that `stage` began (begin) or ended when `id` was the last correlation id issued.
  // An id older than the previous mark's is raised to it, so that ranges never run backwards.
  // Never allocates; false when the buffer is full (the mark is dropped and counted).
  bool mark(int stage, bool begin, std::uint32_t id) {
    if (marks_.size() == capacity_) {
      ++dropped_;
      return false;
    }
    if (have_floor_ && id_before(id, floor_)) id = floor_;
    floor_ = id;
    have_floor_ = true;
    marks_.push_back({stage, begin, id});
    return true;
  }

  // The step's completed sections in the order they ended (the stage timer's order) as id
  // ranges. The section closed by the k-th end mark takes timed[k].device_ms when timed[k] is
  // of its stage (NaN otherwise): the timer calls the observer at the end of every section it
  // completes, so both count the same ends. A begin without its end (still open, or the end
  // dropped) and an end without its begin are left out and counted (unmatched()).
  std::vector<IdSection> sections(const std::vector<TimedSection>& timed) {
    std::vector<IdSection> out;
    std::size_t ends = 0, begins = 0;
    for (std::size_t i = 0; i < marks_.size(); ++i) {
      const Mark& e = marks_[i];
      if (e.begin) {
        ++begins;
        continue;
      }
      const std::size_t ordinal = ends++;
      // The timer times a stage's outermost section only: the same stage's previous mark is
      // this end's begin, or there is none.
      std::size_t j = i;
      while (j > 0 && marks_[j - 1].stage != e.stage) --j;
      if (j == 0 || !marks_[j - 1].begin) continue;
      IdSection s;
      s.stage = e.stage;
      s.begin_id = marks_[j - 1].id;
      s.end_id = e.id;
      if (ordinal < timed.size() && timed[ordinal].stage == e.stage) s.device_ms = timed[ordinal].device_ms;
      out.push_back(s);
    }
    unmatched_ = static_cast<std::int64_t>(begins + ends - 2 * out.size());
    return out;
  }

  const std::vector<Mark>& marks() const { return marks_; }
  std::size_t size() const { return marks_.size(); }
  std::size_t capacity() const { return capacity_; }
  std::int64_t dropped() const { return dropped_; }      // this step's marks lost to a full buffer
  std::int64_t unmatched() const { return unmatched_; }  // marks without a partner, at the last sections()

 private:
  std::size_t capacity_;
  std::vector<Mark> marks_;  // capacity fixed
  std::uint32_t floor_ = 0;  // the last mark's id, across steps
  bool have_floor_ = false;
  std::int64_t dropped_ = 0;
  std::int64_t unmatched_ = 0;
};

}  // namespace relax_straggler::cupti
