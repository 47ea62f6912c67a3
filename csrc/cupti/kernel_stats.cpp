#include "cupti/kernel_stats.h"

#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace relax_straggler::cupti {
namespace {

constexpr double kMsPerNs = 1e-6;
constexpr std::size_t kMax32 = 0xffffffffu;

std::uint64_t fnv1a(const char* s, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(s[i]);
    h *= 1099511628211ull;
  }
  return h;
}

// Time covered by the records of `c` (sorted by begin) whose role is in `roles` (a bit mask),
// and the longest stretch of [begin, end) they leave uncovered, ns.
struct Coverage {
  std::uint64_t covered = 0;
  std::uint64_t longest_gap = 0;
};

template <typename Clipped>
Coverage cover(const std::vector<Clipped>& c, unsigned roles, std::uint64_t begin, std::uint64_t end) {
  Coverage out;
  std::uint64_t block_begin = begin, block_end = begin;  // the open block; empty at first
  for (const Clipped& x : c) {
    if (((1u << x.role) & roles) == 0) continue;
    if (x.begin_ns > block_end) {
      out.covered += block_end - block_begin;
      out.longest_gap = std::max(out.longest_gap, x.begin_ns - block_end);
      block_begin = x.begin_ns;
      block_end = x.end_ns;
    } else {
      block_end = std::max(block_end, x.end_ns);
    }
  }
  out.covered += block_end - block_begin;
  out.longest_gap = std::max(out.longest_gap, end - block_end);
  return out;
}

bool plain_name(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == ':';
  });
}

// "f<A, B<C> >(int)" -> "f<A, B<C> >": the trailing argument list, when the name ends with one.
std::string cut_arguments(const std::string& s) {
  if (s.empty() || s.back() != ')') return s;
  int depth = 0;
  for (std::size_t i = s.size(); i-- > 0;) {
    if (s[i] == ')') ++depth;
    if (s[i] == '(' && --depth == 0) return s.substr(0, i);
  }
  return s;  // unbalanced: left as it is
}

// Template argument lists dropped, except one that is a single plain name.
std::string cut_templates(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '<') {
      out += s[i];
      continue;
    }
    std::size_t j = i;
    int depth = 0;
    for (; j < s.size(); ++j) {
      if (s[j] == '<') ++depth;
      if (s[j] == '>' && --depth == 0) break;
    }
    if (j == s.size()) {  // unbalanced: keep the rest
      out.append(s, i, std::string::npos);
      break;
    }
    const std::string inner = s.substr(i + 1, j - i - 1);
    if (plain_name(inner)) out += "<" + inner + ">";
    i = j;
  }
  return out;
}

// "void ns::f" -> "ns::f": what follows the last space outside () and {} ("(anonymous
// namespace)", "{lambda(int, int)#1}" keep theirs).
std::string cut_return_type(const std::string& s) {
  int depth = 0;
  std::size_t cut = std::string::npos;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    if (ch == '(' || ch == '{') ++depth;
    if (ch == ')' || ch == '}') --depth;
    if (ch == ' ' && depth == 0) cut = i;
  }
  return cut == std::string::npos ? s : s.substr(cut + 1);
}

std::string bounded(const std::string& s, std::size_t max_len) {
  if (s.size() <= max_len) return s;
  if (max_len <= 3) return s.substr(s.size() - max_len);
  return "..." + s.substr(s.size() - (max_len - 3));
}

}  // namespace

bool is_nccl_kernel(const char* name) {
  if (name == nullptr) return false;
  const char* p = name;
  if (p[0] == '_' && p[1] == 'Z') {  // a global function's mangling: _Z<length><name>
    p += 2;
    while (std::isdigit(static_cast<unsigned char>(*p))) ++p;
  }
  return std::strncmp(p, "ncclDevKernel_", 14) == 0 || std::strncmp(p, "ncclKernel_", 11) == 0;
}

std::string short_kernel_name(const char* name, std::size_t max_len) {
  if (name == nullptr || *name == '\0') return "<unnamed>";
  std::string full = name;
  // Only "_Z..." is a function's mangling; __cxa_demangle reads other strings as type
  // manglings ("f" -> "float").
  if (name[0] == '_' && name[1] == 'Z') {
    int status = 0;
    char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    if (status == 0 && demangled != nullptr) full = demangled;
    std::free(demangled);
  }
  const std::string cut = cut_return_type(cut_templates(cut_arguments(full)));
  return bounded(cut.empty() ? full : cut, max_len);
}

KernelStats::KernelStats(std::size_t max_records, std::size_t max_names, std::size_t name_bytes) {
  if (max_records == 0 || max_names == 0 || name_bytes == 0) {
    throw std::invalid_argument("KernelStats: max_records, max_names and name_bytes must be > 0 (got " +
                                std::to_string(max_records) + ", " + std::to_string(max_names) + ", " +
                                std::to_string(name_bytes) + ")");
  }
  if (max_records >= kMax32 || max_names >= kMax32 / 2 || name_bytes >= kMax32) {
    throw std::invalid_argument("KernelStats: max_records, max_names and name_bytes must be < 2^32 (max_names < 2^31)");
  }
  max_records_ = max_records;
  max_names_ = max_names;
  max_name_bytes_ = name_bytes;
  no_name_ = static_cast<std::uint32_t>(max_names);
  records_.reserve(max_records);
  name_bytes_.reserve(name_bytes);
  names_.reserve(max_names);
  std::size_t slots = 1;
  while (slots < 2 * max_names) slots *= 2;  // at most half full: probes stay short and end
  slots_.assign(slots, 0);
  short_names_.resize(max_names + 1);
  order_.reserve(max_records);
  reach_.reserve(max_records);
  groups_.reserve(max_records + 1);
  attributed_.reserve(max_records);
  clipped_.reserve(max_records);
  tallies_.resize(max_names + 1);
  touched_.reserve(max_names + 1);
}

bool KernelStats::add(const ActivityRecord& r) {
  if (r.start_ns == 0 || r.end_ns == 0 || r.end_ns < r.start_ns) {
    ++invalid_;
    return false;
  }
  if (records_.size() == max_records_) {
    ++dropped_;
    return false;
  }
  Role role = kCopy;
  std::uint32_t name_id = no_name_;
  if (r.kind == ActivityKind::kKernel) {
    role = is_nccl_kernel(r.name) ? kNccl : kCompute;
    name_id = intern(r.name);
  }
  records_.push_back({r.start_ns, r.end_ns, r.stream_id, r.correlation_id, name_id, role});
  return true;
}

std::uint32_t KernelStats::intern(const char* name) {
  const char* s = name == nullptr ? "" : name;
  const std::size_t len = std::strlen(s);
  const std::uint64_t h = fnv1a(s, len);
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = static_cast<std::size_t>(h) & mask;
  for (; slots_[i] != 0; i = (i + 1) & mask) {
    const Name& n = names_[slots_[i] - 1];
    if (n.hash == h && n.length == len && std::memcmp(name_bytes_.data() + n.offset, s, len) == 0) {
      return slots_[i] - 1;
    }
  }
  if (names_.size() == max_names_ || max_name_bytes_ - name_bytes_.size() < len + 1) {
    ++dropped_names_;
    return no_name_;
  }
  const auto offset = static_cast<std::uint32_t>(name_bytes_.size());
  name_bytes_.insert(name_bytes_.end(), s, s + len);
  name_bytes_.push_back('\0');
  names_.push_back({h, offset, static_cast<std::uint32_t>(len)});
  slots_[i] = static_cast<std::uint32_t>(names_.size());
  return slots_[i] - 1;
}

const char* KernelStats::mangled(std::uint32_t name_id) const {
  return name_id == no_name_ ? "" : name_bytes_.data() + names_[name_id].offset;
}

const std::string& KernelStats::short_name(std::uint32_t name_id) {
  std::string& s = short_names_[name_id];
  if (s.empty()) s = name_id == no_name_ ? "<name not kept>" : short_kernel_name(mangled(name_id));
  return s;
}

void KernelStats::clear() {
  records_.clear();
  invalid_ = 0;
  dropped_ = 0;
  dropped_names_ = 0;
}

StepKernels KernelStats::summarize(const std::vector<Section>& sections, std::size_t top_k) {
  const std::size_t n = records_.size();
  order_.resize(n);
  for (std::size_t i = 0; i < n; ++i) order_[i] = static_cast<std::uint32_t>(i);
  std::sort(order_.begin(), order_.end(), [this](std::uint32_t a, std::uint32_t b) {
    const Stored &x = records_[a], &y = records_[b];
    if (x.stream_id != y.stream_id) return x.stream_id < y.stream_id;
    if (x.start_ns != y.start_ns) return x.start_ns < y.start_ns;
    return a < b;
  });
  reach_.resize(n);
  groups_.clear();
  for (std::size_t k = 0; k < n; ++k) {
    const Stored& r = records_[order_[k]];
    const bool new_group = k == 0 || records_[order_[k - 1]].stream_id != r.stream_id;
    if (new_group) groups_.push_back(k);
    reach_[k] = new_group ? r.end_ns : std::max(reach_[k - 1], r.end_ns);
  }
  groups_.push_back(n);
  attributed_.assign(n, false);

  std::vector<SectionKernels> measured;
  measured.reserve(sections.size());
  for (const Section& s : sections) measured.push_back(measure(s, top_k));
  return counted(std::move(measured));
}

StepKernels KernelStats::summarize_ids(const std::vector<IdSection>& sections, std::size_t top_k) {
  for (std::size_t i = 0; i < sections.size(); ++i) {
    const double d = sections[i].device_ms;
    if (!std::isnan(d) && !(std::isfinite(d) && d >= 0.0)) {
      throw std::invalid_argument("KernelStats::summarize_ids: section " + std::to_string(i) + " (stage " +
                                  std::to_string(sections[i].stage) +
                                  "): device_ms must be finite and >= 0, or NaN (not measured), got " +
                                  std::to_string(d));
    }
  }
  // Ids relative to the step's earliest begin, so that a wrap of the 32-bit counter inside
  // the step keeps their order; a record issued before it sorts last and is in no section.
  std::uint32_t base = sections.empty() ? 0 : sections.front().begin_id;
  for (const IdSection& s : sections) {
    if (id_before(s.begin_id, base)) base = s.begin_id;
  }
  const std::size_t n = records_.size();
  order_.resize(n);
  for (std::size_t i = 0; i < n; ++i) order_[i] = static_cast<std::uint32_t>(i);
  std::sort(order_.begin(), order_.end(), [this, base](std::uint32_t a, std::uint32_t b) {
    const std::uint32_t x = records_[a].correlation_id - base, y = records_[b].correlation_id - base;
    return x != y ? x < y : a < b;
  });
  attributed_.assign(n, false);
  std::vector<SectionKernels> measured;
  measured.reserve(sections.size());
  for (const IdSection& s : sections) measured.push_back(measure_ids(s, base, top_k));
  return counted(std::move(measured));
}

StepKernels KernelStats::counted(std::vector<SectionKernels> sections) const {
  StepKernels out;
  out.sections = std::move(sections);
  out.records = static_cast<std::int64_t>(records_.size());
  out.invalid_records = invalid_;
  out.dropped_records = dropped_;
  out.dropped_names = dropped_names_;
  out.unattributed_records = static_cast<std::int64_t>(std::count(attributed_.begin(), attributed_.end(), false));
  return out;
}

void KernelStats::clip_group(std::size_t first, std::size_t last, const Section& s) {
  // reach_ grows along a group: records before the first reach >= begin all ended earlier.
  const auto from = std::partition_point(reach_.begin() + static_cast<std::ptrdiff_t>(first),
                                         reach_.begin() + static_cast<std::ptrdiff_t>(last),
                                         [&s](std::uint64_t reach) { return reach < s.begin_ns; });
  for (auto k = static_cast<std::size_t>(from - reach_.begin()); k < last; ++k) {
    const Stored& r = records_[order_[k]];
    if (r.start_ns >= s.end_ns) break;
    const bool inside = r.end_ns > s.begin_ns || (r.start_ns == r.end_ns && r.start_ns >= s.begin_ns);
    if (!inside) continue;
    attributed_[order_[k]] = true;
    clipped_.push_back({std::max(r.start_ns, s.begin_ns), std::min(r.end_ns, s.end_ns), r.name_id, r.role});
  }
}

SectionKernels KernelStats::measure(const Section& s, std::size_t top_k) {
  SectionKernels m;
  m.stage = s.stage;
  m.stream_id = s.stream_id;
  if (s.end_ns <= s.begin_ns) return m;  // empty: nothing ran in it

  clipped_.clear();
  const std::size_t num_groups = groups_.size() - 1;
  if (s.stream_id == kAnyStream) {
    for (std::size_t g = 0; g < num_groups; ++g) clip_group(groups_[g], groups_[g + 1], s);
    std::sort(clipped_.begin(), clipped_.end(),
              [](const Clipped& a, const Clipped& b) { return a.begin_ns < b.begin_ns; });
  } else {
    const auto g = std::partition_point(
        groups_.begin(), groups_.begin() + static_cast<std::ptrdiff_t>(num_groups),
        [&](std::size_t first) { return records_[order_[first]].stream_id < s.stream_id; });
    const auto gi = static_cast<std::size_t>(g - groups_.begin());
    if (gi < num_groups && records_[order_[groups_[gi]]].stream_id == s.stream_id) {
      clip_group(groups_[gi], groups_[gi + 1], s);  // sorted by begin: clipping keeps start order
    }
  }

  tally(m, s.begin_ns, s.end_ns, top_k);
  return m;
}

SectionKernels KernelStats::measure_ids(const IdSection& s, std::uint32_t base, std::size_t top_k) {
  SectionKernels m;
  m.stage = s.stage;
  m.stream_id = kAnyStream;
  clipped_.clear();
  const std::uint32_t lo = s.begin_id - base, hi = s.end_id - base;
  const auto key = [this, base](std::uint32_t i) { return records_[i].correlation_id - base; };
  if (hi > lo) {
    auto k = std::partition_point(order_.begin(), order_.end(), [&](std::uint32_t i) { return key(i) <= lo; });
    for (; k != order_.end() && key(*k) <= hi; ++k) {
      const Stored& r = records_[*k];
      attributed_[*k] = true;
      clipped_.push_back({r.start_ns, r.end_ns, r.name_id, r.role});
    }
  }
  std::sort(clipped_.begin(), clipped_.end(),
            [](const Clipped& a, const Clipped& b) { return a.begin_ns < b.begin_ns; });
  std::uint64_t first = 0, last = 0;  // the span: the records' own extent (none: empty)
  if (!clipped_.empty()) {
    first = clipped_.front().begin_ns;
    for (const Clipped& c : clipped_) last = std::max(last, c.end_ns);
  }
  tally(m, first, last, top_k);
  if (!std::isnan(s.device_ms)) {  // the events saw the whole section, launch gaps at its edges too
    m.length_ms = s.device_ms;
    m.idle_ms = std::max(0.0, s.device_ms - m.busy_ms - m.copy_ms);
  }
  return m;
}

void KernelStats::tally(SectionKernels& m, std::uint64_t begin, std::uint64_t end, std::size_t top_k) {
  constexpr unsigned kKernels = (1u << kCompute) | (1u << kNccl);
  const std::uint64_t length = end - begin;
  const Coverage busy = cover(clipped_, kKernels, begin, end);
  const Coverage any = cover(clipped_, kKernels | (1u << kCopy), begin, end);
  m.length_ms = static_cast<double>(length) * kMsPerNs;
  m.busy_ms = static_cast<double>(busy.covered) * kMsPerNs;
  m.compute_ms = static_cast<double>(cover(clipped_, 1u << kCompute, begin, end).covered) * kMsPerNs;
  m.nccl_ms = static_cast<double>(cover(clipped_, 1u << kNccl, begin, end).covered) * kMsPerNs;
  m.copy_ms = static_cast<double>(any.covered - busy.covered) * kMsPerNs;
  m.idle_ms = static_cast<double>(length - any.covered) * kMsPerNs;
  m.longest_idle_ms = static_cast<double>(any.longest_gap) * kMsPerNs;
  if (!clipped_.empty()) {
    std::uint64_t last = 0;
    for (const Clipped& c : clipped_) last = std::max(last, c.end_ns);
    m.span_ms = static_cast<double>(last - clipped_.front().begin_ns) * kMsPerNs;
  }

  for (const Clipped& c : clipped_) {
    if (c.role == kCopy) continue;
    ++m.kernels;
    Tally& t = tallies_[c.name_id];
    if (t.calls == 0) touched_.push_back(c.name_id);
    t.ns += c.end_ns - c.begin_ns;
    ++t.calls;
  }
  const std::size_t k = std::min(top_k, touched_.size());
  std::partial_sort(touched_.begin(), touched_.begin() + static_cast<std::ptrdiff_t>(k), touched_.end(),
                    [this](std::uint32_t a, std::uint32_t b) {
                      if (tallies_[a].ns != tallies_[b].ns) return tallies_[a].ns > tallies_[b].ns;
                      if ((a == no_name_) != (b == no_name_)) return b == no_name_;  // unnamed last
                      const int by_name = std::strcmp(mangled(a), mangled(b));
                      return by_name != 0 ? by_name < 0 : a < b;
                    });
  m.top.reserve(k);
  for (std::size_t i = 0; i < k; ++i) {
    const Tally& t = tallies_[touched_[i]];
    m.top.push_back({short_name(touched_[i]), static_cast<double>(t.ns) * kMsPerNs, t.calls});
  }
  for (std::uint32_t id : touched_) tallies_[id] = Tally{};
  touched_.clear();
}

}  // namespace relax_straggler::cupti
