// Python bindings of the input scanners (csrc/core/ingest): the Megatron Timers text
// scanner used by relax_straggler.readers.megatron_log.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"
#include "core/ingest/timer_log.h"

namespace py = pybind11;
namespace ig = relax_straggler::core::ingest;

namespace relax_straggler::python {
namespace {

const char* form_name(ig::BlockForm form) {
  switch (form) {
    case ig::BlockForm::kAllRanks: return "all";
    case ig::BlockForm::kMinMax: return "minmax";
    case ig::BlockForm::kMax: return "max";
  }
  return "unknown";
}

template <typename T>
py::array_t<T> to_array(const std::vector<T>& v) {
  py::array_t<T> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

}  // namespace

void bind_ingest(py::module_& m) {
  py::class_<ig::TimerValues>(m, "TimerValues", "One timer of a block: per-rank ms, or min/max ms.")
      .def_readonly("name", &ig::TimerValues::name)
      .def_readonly("line", &ig::TimerValues::line)
      .def_property_readonly("ranks", [](const ig::TimerValues& v) { return to_array(v.ranks); })
      .def_property_readonly("ms", [](const ig::TimerValues& v) { return to_array(v.ms); })
      .def_readonly("min_ms", &ig::TimerValues::min_ms)
      .def_readonly("max_ms", &ig::TimerValues::max_ms);

  py::class_<ig::TimerBlock>(m, "TimerBlock", "One printed timer block (form: 'all', 'minmax' or 'max').")
      .def_property_readonly("form", [](const ig::TimerBlock& b) { return form_name(b.form); })
      .def_readonly("line", &ig::TimerBlock::line)
      .def_readonly("iteration", &ig::TimerBlock::iteration)
      .def_readonly("iteration_ms", &ig::TimerBlock::iteration_ms)
      .def_readonly("timers", &ig::TimerBlock::timers);

  py::class_<ig::TimerLogScanner>(m, "TimerLogScanner",
                                  "Incremental Megatron Timers text scanner (see csrc/core/ingest/timer_log.h).")
      .def(py::init<>())
      .def(
          "feed",
          [](ig::TimerLogScanner& s, const py::bytes& data) {
            const std::string_view view(data);
            py::gil_scoped_release release;
            s.feed(view.data(), view.size());
          },
          py::arg("data"), "Consumes bytes in any chunking.")
      .def("finish", &ig::TimerLogScanner::finish, "End of input: closes the open block.")
      .def("take_blocks", &ig::TimerLogScanner::take_blocks, "Blocks completed since the last call.")
      .def(
          "take_issues",
          [](ig::TimerLogScanner& s) {
            std::vector<std::tuple<std::int64_t, std::string, std::int64_t>> out;
            for (auto& i : s.take_issues()) out.emplace_back(i.line, std::move(i.message), i.rejected);
            return out;
          },
          "(line, message, timer values skipped) of the issues found since the last call.")
      .def_property_readonly("arguments", &ig::TimerLogScanner::arguments)
      .def_property_readonly("lines", &ig::TimerLogScanner::lines)
      .def_property_readonly("values", &ig::TimerLogScanner::values, "Timer values accepted so far.")
      .def_property_readonly("rejected", &ig::TimerLogScanner::rejected, "Timer values skipped by an issue so far.");
}

}  // namespace relax_straggler::python
