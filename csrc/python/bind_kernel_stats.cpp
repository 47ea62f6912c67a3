// Python bindings of the kernel records (csrc/cupti) and of the cause they support
// (csrc/core/confirm/kernel_cause.h) as the submodule relax_straggler._core.kernels.
// relax_straggler/kernel_evidence.py wraps them; call that instead.
//
// KernelStats (the torch-free statistics) is always there, so tests feed it synthetic
// activity records. CuptiCollector is compiled only in a build with CUDA and CUPTI
// (RS_WITH_CUPTI, setup.py); WITH_CUPTI says which build this is.
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "core/confirm/kernel_cause.h"
#include "cupti/kernel_stats.h"
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
             std::uint32_t stream_id, const std::optional<std::string>& name) {
            cu::ActivityRecord r;
            r.kind = kind_of(kind);
            r.start_ns = start_ns;
            r.end_ns = end_ns;
            r.stream_id = stream_id;
            r.name = name ? name->c_str() : nullptr;
            return s.add(r);
          },
          py::arg("kind"), py::arg("start_ns"), py::arg("end_ns"), py::arg("stream_id") = 0,
          py::arg("name") = py::none(),
          "Adds one record (kind 'kernel', 'memcpy' or 'memset'; ns on the records' clock). False when it was "
          "dropped (zero or inverted timestamps, full buffer). ValueError on an unknown kind.")
      .def(
          "summarize",
          [](cu::KernelStats& s, const std::vector<SectionTuple>& sections, std::size_t top_k) {
            return s.summarize(sections_of(sections), top_k);
          },
          py::arg("sections"), py::arg("top_k") = 5,
          "Per section (stage, stream_id, begin_ns, end_ns) its kernel, copy and idle ms and top_k kernels.")
      .def("clear", &cu::KernelStats::clear)
      .def_property_readonly("size", &cu::KernelStats::size)
      .def_property_readonly("capacity", &cu::KernelStats::capacity);
  m.attr("ANY_STREAM") = cu::kAnyStream;
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
                       std::int64_t retry_after) {
             cu::CollectorConfig c;
             c.buffer_bytes = buffer_bytes;
             c.num_buffers = num_buffers;
             c.max_records = max_records;
             c.retry_after = retry_after;
             return std::make_unique<cu::CuptiCollector>(std::move(c));
           }),
           py::arg("buffer_bytes") = std::size_t{4} << 20, py::arg("num_buffers") = 4,
           py::arg("max_records") = std::size_t{1} << 18, py::arg("retry_after") = 50)
      .def("begin_sampled_step", &cu::CuptiCollector::begin_sampled_step, py::arg("profiler_active") = false)
      .def(
          "end_sampled_step",
          [](cu::CuptiCollector& c, const std::vector<SectionTuple>& sections, std::size_t top_k) {
            return c.end_sampled_step(sections_of(sections), top_k);
          },
          py::arg("sections"), py::arg("top_k") = 5)
      .def("shutdown", &cu::CuptiCollector::shutdown)
      .def_property_readonly("mode", &cu::CuptiCollector::mode_name)
      .def_property_readonly("last_error", &cu::CuptiCollector::last_error)
      .def_property_readonly("refusals", &cu::CuptiCollector::refusals)
      .def_property_readonly("collected_steps", &cu::CuptiCollector::collected_steps)
      .def_property_readonly("cupti_dropped_records", &cu::CuptiCollector::cupti_dropped_records);
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
