// Python bindings of the confirmed verdict (csrc/core/confirm) as the submodule
// relax_straggler._core.confirm. relax_straggler/judge/confirm.py wraps it in frozen
// dataclasses; call that instead. update() releases the GIL while the engine runs, and
// std::invalid_argument surfaces as ValueError.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "core/confirm/tracker.h"

namespace py = pybind11;
namespace cf = relax_straggler::core::confirm;
namespace rc = relax_straggler::core;

namespace relax_straggler::python {
namespace {

using Array = py::array_t<double, py::array::c_style | py::array::forcecast>;

cf::ConfirmResult update(cf::ConfirmTracker& tracker, const Array& ms, std::vector<std::string> stages, std::int64_t step,
                         const std::optional<std::vector<std::int32_t>>& groups,
                         const std::optional<std::vector<double>>& workload, const cf::WindowEvidence* window) {
  const auto matrix = step_matrix(ms, std::move(stages), step);
  py::gil_scoped_release release;  // the tracker never touches Python objects
  return tracker.update(matrix, groups.value_or(std::vector<std::int32_t>{}), workload.value_or(std::vector<double>{}),
                        window);
}

}  // namespace

void bind_confirm(py::module_& parent) {
  py::module_ m = parent.def_submodule("confirm", "Confirmed straggler verdict across reports (csrc/core/confirm)");

  py::enum_<cf::State>(m, "State")
      .value("HEALTHY", cf::State::kHealthy)
      .value("SUSPECTED", cf::State::kSuspected)
      .value("STRAGGLER", cf::State::kStraggler)
      .value("RECOVERED", cf::State::kRecovered)
      .value("IMBALANCE", cf::State::kImbalance)
      .value("INSUFFICIENT_EVIDENCE", cf::State::kInsufficientEvidence);
  py::enum_<cf::Cause>(m, "Cause")
      .value("COMPUTE", cf::Cause::kCompute)
      .value("LINK", cf::Cause::kLink)
      .value("DATA", cf::Cause::kData)
      .value("IMBALANCE", cf::Cause::kImbalance)
      .value("UNKNOWN", cf::Cause::kUnknown);
  m.def("state_name", &cf::state_name, py::arg("state"));
  m.def("cause_name", &cf::cause_name, py::arg("cause"));

  const cf::ConfirmConfig d;
  py::class_<cf::ConfirmConfig>(m, "ConfirmConfig", "Settings of the confirmed verdict (csrc/core/confirm/config.h).")
      .def(py::init([](double rel, double abs_ms, double min_impact, double sigmas, std::int32_t confirm,
                       std::int32_t recover,
                       std::int32_t min_reports, std::int32_t history, std::int32_t noise_memory, double window_sigmas,
                       std::int32_t sample, double min_noise, std::vector<std::string> workload_stages,
                       std::vector<std::string> p2p_stages, std::string data_stage, double sequential_budget) {
             cf::ConfirmConfig c{rel, abs_ms, min_impact, sigmas, confirm, recover, min_reports, history, noise_memory,
                                 window_sigmas, sample, min_noise, std::move(workload_stages),
                                 std::move(p2p_stages), std::move(data_stage)};
             c.sequential_budget = sequential_budget;
             c.validate();
             return c;
           }),
           py::arg("relative_threshold") = d.relative_threshold, py::arg("absolute_ms_threshold") = d.absolute_ms_threshold,
           py::arg("min_impact") = d.min_impact, py::arg("noise_sigmas") = d.noise_sigmas, py::arg("confirm_reports") = d.confirm_reports,
           py::arg("recover_reports") = d.recover_reports, py::arg("min_reports") = d.min_reports,
           py::arg("history") = d.history, py::arg("noise_memory") = d.noise_memory,
           py::arg("window_sigmas") = d.window_sigmas,
           py::arg("reference_sample") = d.reference_sample, py::arg("min_noise") = d.min_noise,
           py::arg("workload_stages") = d.workload_stages, py::arg("p2p_stages") = d.p2p_stages,
           py::arg("data_stage") = d.data_stage, py::arg("sequential_budget") = d.sequential_budget);

  py::class_<cf::WindowRank>(m, "WindowRank")
      .def(py::init([](std::int32_t rank, std::int32_t votes, std::vector<std::string> stages) {
             return cf::WindowRank{rank, votes, std::move(stages)};
           }),
           py::arg("rank"), py::arg("votes"), py::arg("stages") = std::vector<std::string>{});
  py::class_<cf::WindowEvidence>(m, "WindowEvidence", "The window ensemble's latest answer, as extra evidence.")
      .def(py::init([](std::int64_t step, std::vector<cf::WindowRank> anomalies, std::vector<std::int32_t> links) {
             return cf::WindowEvidence{step, std::move(anomalies), std::move(links)};
           }),
           py::arg("step"), py::arg("anomalies"), py::arg("link_suspects") = std::vector<std::int32_t>{});

  py::class_<cf::Facts>(m, "Facts", "Measured or counted facts of a finding (ms, counts).")
      .def_readonly("rank_ms", &cf::Facts::rank_ms)
      .def_readonly("ref_ms", &cf::Facts::ref_ms)
      .def_readonly("excess_ms", &cf::Facts::excess_ms)
      .def_readonly("median_ratio", &cf::Facts::median_ratio)
      .def_readonly("noise", &cf::Facts::noise)
      .def_readonly("wait_caused_ms", &cf::Facts::wait_caused_ms)
      .def_readonly("waiting_ranks", &cf::Facts::waiting_ranks)
      .def_readonly("reports_agreeing", &cf::Facts::reports_agreeing)
      .def_readonly("reports_seen", &cf::Facts::reports_seen)
      .def_readonly("window_votes", &cf::Facts::window_votes);
  py::class_<cf::Finding>(m, "Finding")
      .def_readonly("rank", &cf::Finding::rank)
      .def_readonly("group", &cf::Finding::group)
      .def_readonly("stage", &cf::Finding::stage)
      .def_readonly("stage_name", &cf::Finding::stage_name)
      .def_readonly("state", &cf::Finding::state)
      .def_readonly("since_step", &cf::Finding::since_step)
      .def_readonly("confidence", &cf::Finding::confidence)
      .def_readonly("ratio", &cf::Finding::ratio)
      .def_readonly("persistent", &cf::Finding::persistent)
      .def_readonly("by_window", &cf::Finding::by_window)
      .def_readonly("by_sequential", &cf::Finding::by_sequential)
      .def_readonly("facts", &cf::Finding::facts)
      .def_readonly("cause", &cf::Finding::cause);
  py::class_<cf::ConfirmResult>(m, "ConfirmResult")
      .def_readonly("step", &cf::ConfirmResult::step)
      .def_readonly("status", &cf::ConfirmResult::status)
      .def_readonly("findings", &cf::ConfirmResult::findings)
      .def_readonly("unjudged_ranks", &cf::ConfirmResult::unjudged_ranks)
      .def_readonly("reports", &cf::ConfirmResult::reports)
      .def_readonly("reset", &cf::ConfirmResult::reset);

  py::class_<cf::ConfirmTracker>(m, "ConfirmTracker", "Stateful confirmed verdict fed one report at a time.")
      .def(py::init<cf::ConfirmConfig>(), py::arg("config") = cf::ConfirmConfig{})
      .def("update", &update, py::arg("ms"), py::arg("stages"), py::arg("step"), py::arg("groups") = py::none(),
           py::arg("workload") = py::none(), py::arg("window") = nullptr,
           "ms: float64 (ranks, stages) in ms, NaN = not run; stages: names; groups: comparison group id\n"
           "(>= 0) per rank or None; workload: tokens per rank (> 0) or None; window: WindowEvidence or None\n"
           "(keeps the previous). Raises ValueError on malformed input.")
      .def("reset", &cf::ConfirmTracker::reset)
      .def_property_readonly("reports", &cf::ConfirmTracker::reports);
}

}  // namespace relax_straggler::python
