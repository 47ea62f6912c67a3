// Python bindings of the torch-free engine: NaN-aware statistics and judge_step.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings.h"
#include "core/collective_waits.h"
#include "core/stats.h"
#include "core/thresholds.h"
#include "core/verdict.h"

namespace py = pybind11;
namespace core = relax_straggler::core;

namespace relax_straggler::python {
namespace {

using Array = py::array_t<double, py::array::c_style | py::array::forcecast>;

core::Values view_1d(const Array& a, const char* name) {
  if (a.ndim() != 1) throw std::invalid_argument(std::string(name) + " must be 1-D, got " + std::to_string(a.ndim()) + "-D");
  return core::Values(a.data(), static_cast<std::size_t>(a.shape(0)));
}

core::StepVerdict judge(const Array& ms, std::vector<std::string> stages, std::int64_t step,
                        const core::VerdictConfig& config, const std::optional<std::vector<std::int32_t>>& groups) {
  const auto matrix = step_matrix(ms, std::move(stages), step);
  py::gil_scoped_release release;  // the verdict never touches Python objects
  return groups ? core::judge_step(matrix, config, *groups) : core::judge_step(matrix, config);
}

py::tuple collective_waits(const Array& durations_ms) {
  if (durations_ms.ndim() != 2) {
    throw std::invalid_argument("durations_ms must be a 2-D (ranks x collectives) array, got " +
                                std::to_string(durations_ms.ndim()) + "-D");
  }
  const auto ranks = static_cast<std::size_t>(durations_ms.shape(0));
  const auto collectives = static_cast<std::size_t>(durations_ms.shape(1));
  core::CollectiveWaits w;
  {
    py::gil_scoped_release release;
    w = core::collective_waits(durations_ms.data(), ranks, collectives);
  }
  py::array_t<std::int64_t> late(static_cast<py::ssize_t>(ranks));
  py::array_t<double> wait(static_cast<py::ssize_t>(ranks));
  std::copy(w.late_counts.begin(), w.late_counts.end(), late.mutable_data());
  std::copy(w.wait_ms.begin(), w.wait_ms.end(), wait.mutable_data());
  return py::make_tuple(w.blamed_rank, late, wait);
}

}  // namespace

core::StepMatrix step_matrix(const DoubleArray& ms, std::vector<std::string> stages, std::int64_t step) {
  if (ms.ndim() != 2) throw std::invalid_argument("ms must be a 2-D (ranks x stages) array, got " + std::to_string(ms.ndim()) + "-D");
  if (static_cast<std::size_t>(ms.shape(1)) != stages.size()) {
    throw std::invalid_argument("ms has " + std::to_string(ms.shape(1)) + " columns but " +
                                std::to_string(stages.size()) + " stage names were given");
  }
  std::vector<double> values(ms.data(), ms.data() + ms.size());
  return core::StepMatrix::from_rows(step, static_cast<std::int32_t>(ms.shape(0)), std::move(stages), std::move(values));
}

void bind_core(py::module_& m) {
  m.def("nan_mean", [](const Array& a) { return core::nan_mean(view_1d(a, "values")); }, py::arg("values"),
        "Mean of the non-NaN values (NaN if none).");
  m.def("nan_median", [](const Array& a) { return core::nan_median(view_1d(a, "values")); }, py::arg("values"),
        "Median of the non-NaN values (NaN if none).");
  m.def("nan_quantile", [](const Array& a, double q) { return core::nan_quantile(view_1d(a, "values"), q); },
        py::arg("values"), py::arg("q"), "q-quantile, linear interpolation (numpy 'linear'); NaN if q outside [0, 1].");
  m.def("nan_mad", [](const Array& a) { return core::nan_mad(view_1d(a, "values")); }, py::arg("values"),
        "Median absolute deviation around the median, unscaled.");

  py::enum_<core::Reference>(m, "Reference")
      .value("MEAN", core::Reference::kMean)
      .value("MEDIAN", core::Reference::kMedian);
  py::enum_<core::StageKind>(m, "StageKind")
      .value("COMPUTE", core::StageKind::kCompute)
      .value("COMMUNICATION", core::StageKind::kCommunication);
  m.def("stage_kind_of", &core::stage_kind_of, py::arg("stage"));

  // The slow-rank rule's defaults (core/thresholds.h), the Python configurations' too.
  m.attr("DEFAULT_RELATIVE_THRESHOLD") = core::kDefaultRelativeThreshold;
  m.attr("DEFAULT_ABSOLUTE_MS_THRESHOLD") = core::kDefaultAbsoluteMsThreshold;

  py::class_<core::VerdictConfig>(m, "VerdictConfig", "Thresholds of the per-step rule (see csrc/core/verdict.h).")
      .def(py::init([](double rel, double abs_ms, double floor_ms, core::Reference ref) {
             core::VerdictConfig c{rel, abs_ms, floor_ms, ref};
             c.validate();
             return c;
           }),
           py::arg("relative_threshold") = core::kDefaultRelativeThreshold,
           py::arg("absolute_ms_threshold") = core::kDefaultAbsoluteMsThreshold,
           py::arg("noise_floor_ms") = 1.0, py::arg("reference") = core::Reference::kMean)
      .def_readonly("relative_threshold", &core::VerdictConfig::relative_threshold)
      .def_readonly("absolute_ms_threshold", &core::VerdictConfig::absolute_ms_threshold)
      .def_readonly("noise_floor_ms", &core::VerdictConfig::noise_floor_ms)
      .def_readonly("reference", &core::VerdictConfig::reference);

  py::class_<core::StageVerdict>(m, "StageVerdict", "Verdict for one stage of one step (times in ms).")
      .def_readonly("stage", &core::StageVerdict::stage)
      .def_readonly("kind", &core::StageVerdict::kind)
      .def_readonly("ranks_reporting", &core::StageVerdict::ranks_reporting)
      .def_readonly("ref_ms", &core::StageVerdict::ref_ms)
      .def_readonly("mean_ms", &core::StageVerdict::mean_ms)
      .def_readonly("max_ms", &core::StageVerdict::max_ms)
      .def_readonly("min_ms", &core::StageVerdict::min_ms)
      .def_readonly("top_rank", &core::StageVerdict::top_rank)
      .def_readonly("slowdown_ratio", &core::StageVerdict::slowdown_ratio)
      .def_readonly("relative_score", &core::StageVerdict::relative_score)
      .def_readonly("excess_ms", &core::StageVerdict::excess_ms)
      .def_readonly("stragglers", &core::StageVerdict::stragglers)
      .def_readonly("imbalance_ratio", &core::StageVerdict::imbalance_ratio);

  py::class_<core::StepVerdict>(m, "StepVerdict", "Verdict for one sampled step: one StageVerdict per column.")
      .def_readonly("step", &core::StepVerdict::step)
      .def_readonly("stages", &core::StepVerdict::stages)
      .def_readonly("likely_bottleneck", &core::StepVerdict::likely_bottleneck)
      .def_readonly("hints", &core::StepVerdict::hints)
      .def_readonly("unusable_cells", &core::StepVerdict::unusable_cells,
                    "Values that were no time (+-inf, negative), judged as not run.")
      .def_property_readonly("num_stragglers", &core::StepVerdict::num_stragglers);

  m.def("judge_step", &judge, py::arg("ms"), py::arg("stages"), py::arg("step"), py::arg("config"),
        py::arg("groups") = py::none(),
        "Judges one step. ms: float64 array (ranks, stages) in ms, NaN or 0 = not run (+-inf and\n"
        "negatives too, counted in unusable_cells); stages: names;\n"
        "groups: optional comparison group id (>= 0) per rank, e.g. its pipeline stage: ranks are\n"
        "then judged within their group and the spread between groups is imbalance_ratio.\n"
        "Raises ValueError on a shape mismatch, bad groups or an invalid config.");

  m.def("collective_waits", &collective_waits, py::arg("durations_ms"),
        "Per collective, the rank with the shortest duration arrived last; every other rank waited\n"
        "its duration minus that one (csrc/core/collective_waits.h). durations_ms: (ranks >= 2,\n"
        "collectives >= 1) finite ms. Returns (blamed_rank, late_counts (ranks,) int64, wait_ms\n"
        "(ranks,) summed ms). Raises ValueError on a bad shape or a non-finite duration.");
}

}  // namespace relax_straggler::python
