// Python bindings of the kernel records (csrc/cupti) and of the cause they support
// (csrc/core/confirm/kernel_cause.h) as the submodule relax_straggler._core.kernels.
// relax_straggler/live/kernel_evidence.py wraps them; call that instead.
//
// KernelStats (the torch-free statistics) is always there, so tests feed it synthetic
// activity records, and so is SectionRecorder, a section observer for the stage timer whose
// correlation ids come from a counter the test advances. CuptiCollector is compiled only in
// a build with CUDA and CUPTI (RS_WITH_CUPTI, setup.py); WITH_CUPTI says which build this is.
// A section observer reaches the timer (relax_straggler._C) as a PyCapsule
// (csrc/cupti/section_observer.h).
#include <pybind11/stl.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"
#include "core/confirm/kernel_cause.h"
#include "cupti/kernel_stats.h"
#include "cupti/section_marks.h"
#include "cupti/section_observer.h"
#ifdef RS_WITH_CUPTI
#include "cupti/cupti_collector.h"
#endif

namespace py = pybind11;
namespace cu = relax_straggler::cupti;
namespace cf = relax_straggler::core::confirm;

namespace relax_straggler::python {
namespace {

using SectionTuple = std::tuple<int, std::uint32_t, std::uint64_t, std::uint64_t>;

// (stage, stream_id, begin_ns, end_ns) tuples -> Sections.
std::vector<cu::Section> sections_of(const std::vector<SectionTuple>& in) {
  std::vector<cu::Section> out;
  out.reserve(in.size());
  for (const auto& [stage, stream, begin, end] : in) out.push_back({stage, stream, begin, end});
  return out;
}

using IdSectionTuple = std::tuple<int, std::uint32_t, std::uint32_t, double>;
using TimedTuple = std::pair<int, double>;

// (stage, begin_id, end_id, device_ms) tuples <-> IdSections.
std::vector<cu::IdSection> id_sections_of(const std::vector<IdSectionTuple>& in) {
  std::vector<cu::IdSection> out;
  out.reserve(in.size());
  for (const auto& [stage, begin, end, device_ms] : in) out.push_back({stage, begin, end, device_ms});
  return out;
}

std::vector<IdSectionTuple> id_tuples_of(const std::vector<cu::IdSection>& in) {
  std::vector<IdSectionTuple> out;
  out.reserve(in.size());
  for (const cu::IdSection& s : in) out.emplace_back(s.stage, s.begin_id, s.end_id, s.device_ms);
  return out;
}

// The stage timer's (stage, device ms) pairs (StageTimer.last_sections) -> TimedSections.
std::vector<cu::TimedSection> timed_of(const std::vector<TimedTuple>& in) {
  std::vector<cu::TimedSection> out;
  out.reserve(in.size());
  for (const auto& [stage, ms] : in) out.push_back({stage, ms});
  return out;
}

// A capsule handing `observer` to StageTimer.set_section_observer. It holds a reference to
// `owner`, the object observer.ctx points into, so that ctx lives while the capsule does.
struct ObserverHandle {
  relax_straggler::SectionObserver observer;
  PyObject* owner;
};

void release_observer(PyObject* capsule) {
  auto* h = static_cast<ObserverHandle*>(PyCapsule_GetContext(capsule));
  if (h == nullptr) return;
  Py_XDECREF(h->owner);
  delete h;
}

py::object observer_capsule(relax_straggler::SectionObserver observer, const py::handle& owner) {
  auto* h = new ObserverHandle{observer, owner.ptr()};
  PyObject* capsule = PyCapsule_New(&h->observer, relax_straggler::kSectionObserverCapsule, release_observer);
  if (capsule == nullptr || PyCapsule_SetContext(capsule, h) != 0) {
    Py_XDECREF(capsule);
    delete h;
    throw py::error_already_set();
  }
  Py_INCREF(owner.ptr());
  return py::reinterpret_steal<py::object>(capsule);
}

// A section observer for tests, on any build: it records the timer's marks as the CUPTI
// collector does (SectionMarks), with the last correlation id taken from a counter the test
// advances (issue()), and counts every call.
class SectionRecorder {
 public:
  explicit SectionRecorder(std::size_t capacity) : marks_(capacity) {}

  static void on_section(void* ctx, int stage, int begin) {
    static_cast<SectionRecorder*>(ctx)->mark(stage, begin != 0);
  }
  std::uint32_t issue(std::uint32_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    last_id_ += n;
    return last_id_;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    marks_.clear();
  }
  std::vector<std::tuple<int, bool, std::uint32_t>> marks() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::tuple<int, bool, std::uint32_t>> out;
    for (const auto& m : marks_.marks()) out.emplace_back(m.stage, m.begin, m.id);
    return out;
  }
  std::vector<IdSectionTuple> sections(const std::vector<TimedTuple>& timed) {
    std::lock_guard<std::mutex> lock(mu_);
    return id_tuples_of(marks_.sections(timed_of(timed)));
  }
  std::int64_t calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  std::int64_t dropped() {
    std::lock_guard<std::mutex> lock(mu_);
    return marks_.dropped();
  }
  std::int64_t unmatched() {
    std::lock_guard<std::mutex> lock(mu_);
    return marks_.unmatched();
  }

 private:
  void mark(int stage, bool begin) {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    marks_.mark(stage, begin, last_id_);
  }

  std::mutex mu_;
  cu::SectionMarks marks_;
  std::uint32_t last_id_ = 0;
  std::int64_t calls_ = 0;
};

cu::ActivityKind kind_of(const std::string& kind) {
  if (kind == "kernel") return cu::ActivityKind::kKernel;
  if (kind == "memcpy") return cu::ActivityKind::kMemcpy;
  if (kind == "memset") return cu::ActivityKind::kMemset;
  throw std::invalid_argument("activity kind must be 'kernel', 'memcpy' or 'memset', got '" + kind + "'");
}

void bind_results(py::module_& m) {
  py::class_<cu::KernelTime>(m, "KernelTime", "One kernel's share of a section.")
      .def_readonly("name", &cu::KernelTime::name)
      .def_readonly("ms", &cu::KernelTime::ms)
      .def_readonly("calls", &cu::KernelTime::calls);
  py::class_<cu::SectionKernels>(m, "SectionKernels",
                                 "What a section's stream did, ms: length = busy + copy + idle (kernel_stats.h).")
      .def_readonly("stage", &cu::SectionKernels::stage)
      .def_readonly("stream_id", &cu::SectionKernels::stream_id)
      .def_readonly("length_ms", &cu::SectionKernels::length_ms)
      .def_readonly("busy_ms", &cu::SectionKernels::busy_ms)
      .def_readonly("compute_ms", &cu::SectionKernels::compute_ms)
      .def_readonly("nccl_ms", &cu::SectionKernels::nccl_ms)
      .def_readonly("copy_ms", &cu::SectionKernels::copy_ms)
      .def_readonly("idle_ms", &cu::SectionKernels::idle_ms)
      .def_readonly("longest_idle_ms", &cu::SectionKernels::longest_idle_ms)
      .def_readonly("span_ms", &cu::SectionKernels::span_ms)
      .def_readonly("kernels", &cu::SectionKernels::kernels)
      .def_readonly("top", &cu::SectionKernels::top);
  py::class_<cu::StepKernels>(m, "StepKernels", "summarize()'s answer: the sections in order and the record counts.")
      .def_readonly("sections", &cu::StepKernels::sections)
      .def_readonly("records", &cu::StepKernels::records)
      .def_readonly("invalid_records", &cu::StepKernels::invalid_records)
      .def_readonly("dropped_records", &cu::StepKernels::dropped_records)
      .def_readonly("dropped_names", &cu::StepKernels::dropped_names)
      .def_readonly("unattributed_records", &cu::StepKernels::unattributed_records);
}

void bind_stats(py::module_& m) {
  py::class_<cu::KernelStats>(m, "KernelStats",
                              "Bounded per-step store of activity records and their per-section summary "
                              "(csrc/cupti/kernel_stats.h). Not thread-safe.")
      .def(py::init<std::size_t, std::size_t, std::size_t>(), py::arg("max_records"), py::arg("max_names") = 4096,
           py::arg("name_bytes") = std::size_t{1} << 20)
      .def(
          "add",
          [](cu::KernelStats& s, const std::string& kind, std::uint64_t start_ns, std::uint64_t end_ns,
             std::uint32_t stream_id, const std::optional<std::string>& name, std::uint32_t correlation_id) {
            cu::ActivityRecord r;
            r.kind = kind_of(kind);
            r.start_ns = start_ns;
            r.end_ns = end_ns;
            r.stream_id = stream_id;
            r.correlation_id = correlation_id;
            r.name = name ? name->c_str() : nullptr;
            return s.add(r);
          },
          py::arg("kind"), py::arg("start_ns"), py::arg("end_ns"), py::arg("stream_id") = 0,
          py::arg("name") = py::none(), py::arg("correlation_id") = 0,
          "Adds one record (kind 'kernel', 'memcpy' or 'memset'; ns on the records' clock; correlation_id: "
          "the launching call's). False when it was dropped (zero or inverted timestamps, full buffer). "
          "ValueError on an unknown kind.")
      .def(
          "summarize",
          [](cu::KernelStats& s, const std::vector<SectionTuple>& sections, std::size_t top_k) {
            return s.summarize(sections_of(sections), top_k);
          },
          py::arg("sections"), py::arg("top_k") = 5,
          "Per section (stage, stream_id, begin_ns, end_ns) its kernel, copy and idle ms and top_k kernels.")
      .def(
          "summarize_ids",
          [](cu::KernelStats& s, const std::vector<IdSectionTuple>& sections, std::size_t top_k) {
            return s.summarize_ids(id_sections_of(sections), top_k);
          },
          py::arg("sections"), py::arg("top_k") = 5,
          "Per section (stage, begin_id, end_id, device_ms) the records whose correlation id is in "
          "(begin_id, end_id]: kernel, copy and idle ms (idle against device_ms; NaN: the gaps of the span) "
          "and top_k kernels. ValueError when a device_ms is negative or infinite.")
      .def("clear", &cu::KernelStats::clear)
      .def_property_readonly("size", &cu::KernelStats::size)
      .def_property_readonly("capacity", &cu::KernelStats::capacity);
  m.attr("ANY_STREAM") = cu::kAnyStream;
  py::class_<SectionRecorder>(m, "SectionRecorder",
                              "A section observer for tests: the stage timer's marks with correlation ids from a "
                              "counter advanced by issue() (the CUPTI collector reads CUPTI's instead).")
      .def(py::init<std::size_t>(), py::arg("capacity") = 4096)
      .def(
          "observer",
          [](py::object self) {
            return observer_capsule({&SectionRecorder::on_section, &self.cast<SectionRecorder&>()}, self);
          },
          "A capsule for StageTimer.set_section_observer (it keeps this recorder alive).")
      .def("issue", &SectionRecorder::issue, py::arg("n") = 1,
           "Advances the last correlation id by n (as n API calls would); returns it.")
      .def("clear", &SectionRecorder::clear, "Forgets the marks (a step starts); the call count is kept.")
      .def_property_readonly("marks", &SectionRecorder::marks, "(stage, begin, id) per recorded mark.")
      .def("sections", &SectionRecorder::sections, py::arg("timed"),
           "(stage, begin_id, end_id, device_ms) per completed section, device ms from `timed` "
           "(StageTimer.last_sections).")
      .def_property_readonly("calls", &SectionRecorder::calls, "Observer calls so far.")
      .def_property_readonly("dropped", &SectionRecorder::dropped)
      .def_property_readonly("unmatched", &SectionRecorder::unmatched);
  m.def("is_nccl_kernel", [](const std::string& name) { return cu::is_nccl_kernel(name.c_str()); }, py::arg("name"));
  m.def("short_kernel_name", [](const std::string& name, std::size_t max_len) {
    return cu::short_kernel_name(name.c_str(), max_len);
  }, py::arg("name"), py::arg("max_len") = 80);
}

void bind_cause(py::module_& m) {
  py::class_<cf::KernelTimes>(m, "KernelTimes", "One rank's kernel times in one stage section, ms (NaN = not measured).")
      .def(py::init([](double kernel_ms, double idle_ms, double nccl_ms) {
             return cf::KernelTimes{kernel_ms, idle_ms, nccl_ms};
           }),
           py::arg("kernel_ms"), py::arg("idle_ms"), py::arg("nccl_ms"))
      .def_readonly("kernel_ms", &cf::KernelTimes::kernel_ms)
      .def_readonly("idle_ms", &cf::KernelTimes::idle_ms)
      .def_readonly("nccl_ms", &cf::KernelTimes::nccl_ms);
  const cf::KernelCauseConfig d;
  py::class_<cf::KernelCauseConfig>(m, "KernelCauseConfig", "Thresholds of the kernel cause rule (kernel_cause.h).")
      .def(py::init([](double min_excess_ms, double min_share, double peer_tolerance) {
             cf::KernelCauseConfig c{min_excess_ms, min_share, peer_tolerance};
             c.validate();
             return c;
           }),
           py::arg("min_excess_ms") = d.min_excess_ms, py::arg("min_share") = d.min_share,
           py::arg("peer_tolerance") = d.peer_tolerance)
      .def_readonly("min_excess_ms", &cf::KernelCauseConfig::min_excess_ms)
      .def_readonly("min_share", &cf::KernelCauseConfig::min_share)
      .def_readonly("peer_tolerance", &cf::KernelCauseConfig::peer_tolerance);
  py::class_<cf::KernelCauseResult>(m, "KernelCauseResult")
      .def_property_readonly("cause", [](const cf::KernelCauseResult& r) { return std::string(cf::cause_name(r.cause)); })
      .def_readonly("rank", &cf::KernelCauseResult::rank)
      .def_readonly("reference", &cf::KernelCauseResult::reference)
      .def_readonly("kernel_excess_ms", &cf::KernelCauseResult::kernel_excess_ms)
      .def_readonly("idle_excess_ms", &cf::KernelCauseResult::idle_excess_ms)
      .def_readonly("nccl_excess_ms", &cf::KernelCauseResult::nccl_excess_ms)
      .def_readonly("peers", &cf::KernelCauseResult::peers);
  m.def("kernel_cause", &cf::kernel_cause, py::arg("group"), py::arg("rank"), py::arg("config") = d,
        "The cause ('device', 'host', 'communication_link' or 'unknown') for member `rank` of `group` (KernelTimes "
        "of the ranks of its comparison group). ValueError when rank is out of range.");
}

#ifdef RS_WITH_CUPTI
void bind_collector(py::module_& m) {
  py::class_<cu::CuptiCollector>(m, "CuptiCollector",
                                 "Kernel records of sampled steps through CUPTI (csrc/cupti/cupti_collector.h).")
      .def(py::init([](std::size_t buffer_bytes, std::size_t num_buffers, std::size_t max_records,
                       std::int64_t retry_after, std::size_t max_marks) {
             cu::CollectorConfig c;
             c.buffer_bytes = buffer_bytes;
             c.num_buffers = num_buffers;
             c.max_records = max_records;
             c.retry_after = retry_after;
             c.max_marks = max_marks;
             return std::make_unique<cu::CuptiCollector>(std::move(c));
           }),
           py::arg("buffer_bytes") = std::size_t{4} << 20, py::arg("num_buffers") = 4,
           py::arg("max_records") = std::size_t{1} << 18, py::arg("retry_after") = 50, py::arg("max_marks") = 8192)
      .def("begin_sampled_step", &cu::CuptiCollector::begin_sampled_step, py::arg("profiler_active") = false)
      .def(
          "end_sampled_step",
          [](cu::CuptiCollector& c, const std::vector<SectionTuple>& sections, std::size_t top_k) {
            return c.end_sampled_step(sections_of(sections), top_k);
          },
          py::arg("sections"), py::arg("top_k") = 5)
      .def(
          "end_observed_step",
          [](cu::CuptiCollector& c, const std::vector<TimedTuple>& timed, std::size_t top_k) {
            return c.end_observed_step(timed_of(timed), top_k);
          },
          py::arg("timed"), py::arg("top_k") = 5,
          "Ends the step over the sections the observer saw, by correlation id; timed: StageTimer.last_sections.")
      .def(
          "section_observer",
          [](py::object self) { return observer_capsule(self.cast<cu::CuptiCollector&>().section_observer(), self); },
          "A capsule for StageTimer.set_section_observer (it keeps this collector alive).")
      .def("shutdown", &cu::CuptiCollector::shutdown)
      .def_property_readonly("mode", &cu::CuptiCollector::mode_name)
      .def_property_readonly("last_error", &cu::CuptiCollector::last_error)
      .def_property_readonly("refusals", &cu::CuptiCollector::refusals)
      .def_property_readonly("collected_steps", &cu::CuptiCollector::collected_steps)
      .def_property_readonly("cupti_dropped_records", &cu::CuptiCollector::cupti_dropped_records)
      .def_property_readonly("dropped_marks", &cu::CuptiCollector::dropped_marks)
      .def_property_readonly("unmatched_marks", &cu::CuptiCollector::unmatched_marks);
}
#endif

}  // namespace

void bind_kernel_stats(py::module_& parent) {
  py::module_ m = parent.def_submodule("kernels", "Kernel records of sampled steps and the cause they support");
  bind_results(m);
  bind_stats(m);
  bind_cause(m);
#ifdef RS_WITH_CUPTI
  bind_collector(m);
  m.attr("WITH_CUPTI") = true;
#else
  m.attr("WITH_CUPTI") = false;
#endif
}

}  // namespace relax_straggler::python
