// What the GPU did inside each stage section of a sampled step, from activity records.
//
// CUDA events time the stream: a section whose stream sat idle while the host stalled and a
// section whose kernels ran slowly read alike. Kernel records (CUPTI's activity API,
// csrc/cupti/cupti_collector.h) tell them apart. Per section this yields the time kernels kept
// the section's stream busy (NCCL kernels apart from compute), the time copies did, the idle
// rest, and the kernels that took the most time.
//
// A section is given either as a time range on the records' clock (Section, summarize()) or as
// the correlation ids of the API calls made in it (IdSection, summarize_ids()): every record
// carries the id of the call that launched it, and ids grow in issue order process-wide, so a
// kernel launched inside a section belongs to it wherever and whenever it ran.
//
// Bounded: the record buffer, the kernel-name table and the scratch space of summarize() are
// sized once at construction. add() never allocates; a full buffer drops the record and counts
// it. Plain C++17, no CUDA headers. Not thread-safe: the collector serialises add() (called
// from CUPTI's buffer callback) and summarize().
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace relax_straggler::cupti {

enum class ActivityKind : std::uint8_t { kKernel, kMemcpy, kMemset };

// One activity record as CUPTI reports it.
struct ActivityRecord {
  ActivityKind kind = ActivityKind::kKernel;
  std::uint64_t start_ns = 0;  // GPU timestamps (CUPTI's clock), ns; 0 = not recorded
  std::uint64_t end_ns = 0;
  std::uint32_t stream_id = 0;       // CUPTI's stream id (cuptiGetStreamIdEx)
  std::uint32_t correlation_id = 0;  // CUPTI's id of the launching API call (summarize_ids)
  const char* name = nullptr;        // kernels: mangled or plain name, copied by add()
};

// A section's stream_id that matches records on every stream.
inline constexpr std::uint32_t kAnyStream = 0xffffffffu;

// One stage section of the step: [begin_ns, end_ns) on the records' clock, on one stream.
struct Section {
  int stage = 0;  // the caller's stage id, copied to the result
  std::uint32_t stream_id = kAnyStream;
  std::uint64_t begin_ns = 0;
  std::uint64_t end_ns = 0;  // end_ns <= begin_ns: an empty section
};

// One stage section of the step as the correlation ids of the API calls made in it:
// (begin_id, end_id], ids compared modulo 2^32 (the counter may wrap in a long run; a step's
// ids span less than 2^31). end_id == begin_id: no call was made in it (an empty section).
struct IdSection {
  int stage = 0;           // the caller's stage id, copied to the result
  std::uint32_t begin_id = 0;  // the last id issued before the section began
  std::uint32_t end_id = 0;    // the last id issued before it ended
  // The section's device time measured by the stage timer's events, ms; NaN: not measured.
  double device_ms = std::numeric_limits<double>::quiet_NaN();
};

// Whether correlation id a was issued before b, modulo 2^32 (ids less than 2^31 apart).
inline bool id_before(std::uint32_t a, std::uint32_t b) { return ((a - b) & 0x80000000u) != 0; }

// One kernel's share of a section.
struct KernelTime {
  std::string name;  // demangled and shortened (short_kernel_name)
  double ms = 0.0;   // summed durations, each clipped to the section
  std::int64_t calls = 0;
};

// What the section's stream did, ms. length = busy + copy + idle; busy counts every instant a
// kernel ran once (overlapping records are not double counted); compute and NCCL are the same
// union over the non-NCCL and the NCCL kernels alone.
//
// An IdSection's records are its own, not clipped: length is its event-measured device time
// (or, not measured, its span), idle = length - busy - copy clamped at 0 (or, not measured, the
// gaps inside the span), the longest gap is the longest inside the span.
struct SectionKernels {
  int stage = 0;
  std::uint32_t stream_id = kAnyStream;
  double length_ms = 0.0;
  double busy_ms = 0.0;     // at least one kernel running
  double compute_ms = 0.0;  // at least one non-NCCL kernel running
  double nccl_ms = 0.0;     // at least one NCCL kernel running (is_nccl_kernel)
  double copy_ms = 0.0;     // a memcpy or memset running, no kernel
  double idle_ms = 0.0;     // nothing running: launch gaps and host stalls
  double longest_idle_ms = 0.0;  // the longest such gap (one host stall or many small gaps)
  double span_ms = 0.0;          // the section's first record start to its last record end
  std::int64_t kernels = 0;      // kernel records overlapping the section
  std::vector<KernelTime> top;   // by ms descending, then mangled name (a name not kept last)
};

// summarize()'s answer: the sections in the order given and the counts of the records added
// since the last clear().
struct StepKernels {
  std::vector<SectionKernels> sections;
  std::int64_t records = 0;               // kept in the buffer
  std::int64_t invalid_records = 0;       // zero or inverted timestamps, dropped
  std::int64_t dropped_records = 0;       // buffer full, dropped
  std::int64_t dropped_names = 0;         // kept, but the name table was full
  std::int64_t unattributed_records = 0;  // kept, inside no section
};

class KernelStats {
 public:
  // max_records: the buffer's capacity; max_names: distinct kernel names kept, name_bytes:
  // their total length. Names outlive clear() (a run repeats its kernels every step).
  // Throws std::invalid_argument when a size is 0 or max_records >= 2^32.
  explicit KernelStats(std::size_t max_records, std::size_t max_names = 4096, std::size_t name_bytes = 1u << 20);

  // Copies one record in: O(length of its name), no allocation. Returns false when it was
  // dropped: zero or inverted timestamps (invalid_records) or a full buffer (dropped_records).
  bool add(const ActivityRecord& record);

  // Kernel, copy and idle time of each section, with its top_k kernels. A record inside
  // several sections counts in each; one inside none is unattributed. Reuses scratch space
  // sized at construction; allocates only the answer (and each kernel name's short form, once).
  StepKernels summarize(const std::vector<Section>& sections, std::size_t top_k);

  // The same, per IdSection: a record belongs to each section whose id range holds its
  // correlation id, on any stream; one in none is unattributed. Throws std::invalid_argument
  // when a device_ms is negative or infinite (naming the section).
  StepKernels summarize_ids(const std::vector<IdSection>& sections, std::size_t top_k);

  // Forgets the records and the per-step counts (the start of the next sampled step).
  void clear();

  std::size_t size() const { return records_.size(); }
  std::size_t capacity() const { return max_records_; }
  std::int64_t invalid_records() const { return invalid_; }
  std::int64_t dropped_records() const { return dropped_; }
  std::int64_t dropped_names() const { return dropped_names_; }

 private:
  enum Role : std::uint8_t { kCompute, kNccl, kCopy };
  struct Stored {
    std::uint64_t start_ns;
    std::uint64_t end_ns;
    std::uint32_t stream_id;
    std::uint32_t correlation_id;
    std::uint32_t name_id;  // index into names_, or kNoName
    Role role;
  };
  struct Clipped {
    std::uint64_t begin_ns;
    std::uint64_t end_ns;
    std::uint32_t name_id;
    Role role;
  };
  struct Name {
    std::uint64_t hash;
    std::uint32_t offset;  // into name_bytes_
    std::uint32_t length;
  };
  struct Tally {
    std::uint64_t ns = 0;
    std::int64_t calls = 0;
  };

  std::uint32_t intern(const char* name);
  const char* mangled(std::uint32_t name_id) const;
  const std::string& short_name(std::uint32_t name_id);
  // Appends the records of stream group [first, last) of order_ overlapping `s`, clipped.
  void clip_group(std::size_t first, std::size_t last, const Section& s);
  SectionKernels measure(const Section& s, std::size_t top_k);
  // The records whose ids lie in s's range (order_ sorted by id - base, base the earliest begin).
  SectionKernels measure_ids(const IdSection& s, std::uint32_t base, std::size_t top_k);
  // Times and top kernels of clipped_ over [begin, end) into m (clipped_ sorted by begin).
  void tally(SectionKernels& m, std::uint64_t begin, std::uint64_t end, std::size_t top_k);
  StepKernels counted(std::vector<SectionKernels> sections) const;

  std::size_t max_records_ = 0;
  std::size_t max_names_ = 0;
  std::size_t max_name_bytes_ = 0;
  std::uint32_t no_name_ = 0;  // name id of a kernel whose name was not kept: max_names
  std::vector<Stored> records_;
  std::vector<char> name_bytes_;  // the kept names, back to back (capacity fixed)
  std::vector<Name> names_;       // capacity max_names
  std::vector<std::uint32_t> slots_;  // open-addressing table of name id + 1, 0 = free
  std::vector<std::string> short_names_;  // per name id (and no_name_), filled on first use

  // summarize() scratch, sized at construction.
  std::vector<std::uint32_t> order_;  // record indices by (stream, start), or by id (summarize_ids)
  std::vector<std::uint64_t> reach_;  // running max of end_ns along order_, per stream group
  std::vector<std::size_t> groups_;   // where each stream's run of order_ starts, then size
  std::vector<bool> attributed_;      // per record
  std::vector<Clipped> clipped_;      // one section's records
  std::vector<Tally> tallies_;        // per name id
  std::vector<std::uint32_t> touched_;  // name ids with a tally this section

  std::int64_t invalid_ = 0;
  std::int64_t dropped_ = 0;
  std::int64_t dropped_names_ = 0;
};

// Whether a kernel name (mangled or not) is an NCCL kernel: ncclDevKernel_* or ncclKernel_*.
bool is_nccl_kernel(const char* name);

// A kernel name fit for a report line: demangled (abi::__cxa_demangle, names starting with
// "_Z" only), return type, argument list and template arguments cut (a template argument
// that is one plain name, as CUTLASS's generated kernel classes are, is kept), at most
// max_len characters (a longer one keeps its end, which names the function, after "...").
// A null or empty name gives "<unnamed>".
std::string short_kernel_name(const char* name, std::size_t max_len = 80);

}  // namespace relax_straggler::cupti
