// Python bindings of offline attribution (csrc/core/attribute): the RunAttributor that
// classifies compute slowness (individual vs structural) and cross-validates pipeline
// send/recv times, one step at a time. Enumerations cross as their snake_case names.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings.h"
#include "core/attribute/run_attributor.h"
#include "core/thresholds.h"

namespace py = pybind11;
namespace at = relax_straggler::core::attribute;

namespace relax_straggler::python {
namespace {

using Array = py::array_t<double, py::array::c_style | py::array::forcecast>;

std::vector<double> matrix(const Array& a, const char* name, py::ssize_t rows, py::ssize_t cols) {
  if (a.ndim() != 2 || a.shape(0) != rows || a.shape(1) != cols) {
    std::string got = std::to_string(a.ndim()) + "-D";
    if (a.ndim() == 2) got = "(" + std::to_string(a.shape(0)) + ", " + std::to_string(a.shape(1)) + ")";
    throw std::invalid_argument(std::string(name) + " must have shape (" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "), got " + got);
  }
  return std::vector<double>(a.data(), a.data() + a.size());
}

at::StepAttribution add_step(at::RunAttributor& run, std::int64_t step, const Array& compute_ms,
                             const std::optional<Array>& p2p_ms, double step_ms,
                             const std::optional<Array>& collective_ms) {
  const py::ssize_t workers = run.shape().workers();
  at::WorkerStep s;
  s.step = step;
  s.step_ms = step_ms;
  s.compute_ms = matrix(compute_ms, "compute_ms", workers, static_cast<py::ssize_t>(run.compute_stages().size()));
  if (p2p_ms) s.p2p_ms = matrix(*p2p_ms, "p2p_ms", workers, static_cast<py::ssize_t>(at::kNumP2pOps));
  const auto collectives = static_cast<py::ssize_t>(run.collective_stages().size());
  if (collective_ms) {
    s.collective_ms = matrix(*collective_ms, "collective_ms", workers, collectives);
  } else if (collectives > 0) {
    throw std::invalid_argument("collective_ms is required: the attributor has collective stages");
  }
  py::gil_scoped_release release;
  return run.add_step(s);
}

py::array_t<double> peer_refs(const at::StepAttribution& s, std::int32_t pp) {
  const auto stages = static_cast<py::ssize_t>(s.compute.peer_ref_ms.size()) / pp;
  py::array_t<double> out({static_cast<py::ssize_t>(pp), stages});
  std::copy(s.compute.peer_ref_ms.begin(), s.compute.peer_ref_ms.end(), out.mutable_data());
  return out;
}

std::optional<std::string> op_name(std::int32_t op) {
  if (op < 0) return std::nullopt;
  return std::string(at::p2p_op_name(static_cast<at::P2pOp>(op)));
}

}  // namespace

void bind_attribute(py::module_& m) {
  m.attr("P2P_OPS") = py::make_tuple("forward-send", "forward-recv", "backward-send", "backward-recv");

  py::class_<at::AttributionConfig>(m, "AttributionConfig",
                                    "Thresholds of offline attribution (see csrc/core/attribute/worker_grid.h).")
      .def(py::init([](double rel, double abs_ms, double min_impact, double p2p_ratio, double jump_ratio,
                       double baseline_ratio, double slow_step_ratio, std::int32_t slow_step_window,
                       double persistence) {
             at::AttributionConfig c{rel,         abs_ms,          min_impact,       p2p_ratio, jump_ratio,
                                     baseline_ratio, slow_step_ratio, slow_step_window, persistence};
             c.validate();
             return c;
           }),
           py::arg("relative_threshold") = core::kDefaultRelativeThreshold,
           py::arg("absolute_ms_threshold") = core::kDefaultAbsoluteMsThreshold, py::arg("min_impact") = 0.02,
           py::arg("p2p_ratio") = 1.3, py::arg("jump_ratio") = 2.0, py::arg("baseline_ratio") = 2.0,
           py::arg("slow_step_ratio") = 1.25, py::arg("slow_step_window") = 20, py::arg("persistence") = 0.5)
      .def_readonly("relative_threshold", &at::AttributionConfig::relative_threshold)
      .def_readonly("absolute_ms_threshold", &at::AttributionConfig::absolute_ms_threshold)
      .def_readonly("min_impact", &at::AttributionConfig::min_impact)
      .def_readonly("p2p_ratio", &at::AttributionConfig::p2p_ratio)
      .def_readonly("jump_ratio", &at::AttributionConfig::jump_ratio)
      .def_readonly("baseline_ratio", &at::AttributionConfig::baseline_ratio)
      .def_readonly("slow_step_ratio", &at::AttributionConfig::slow_step_ratio)
      .def_readonly("slow_step_window", &at::AttributionConfig::slow_step_window)
      .def_readonly("persistence", &at::AttributionConfig::persistence);

  py::class_<at::ComputeFlag>(m, "ComputeFlag", "One slow compute cell of one step (ms).")
      .def_property_readonly("kind", [](const at::ComputeFlag& f) {
        return f.kind == at::SlowKind::kIndividual ? "individual" : "structural";
      })
      .def_readonly("worker", &at::ComputeFlag::worker)
      .def_readonly("pp_rank", &at::ComputeFlag::pp_rank)
      .def_readonly("stage", &at::ComputeFlag::stage)
      .def_readonly("ms", &at::ComputeFlag::ms)
      .def_readonly("ref_ms", &at::ComputeFlag::ref_ms);

  py::class_<at::P2pFinding>(m, "P2pFinding", "One abnormal p2p time of one step and its resolution (ms).")
      .def_readonly("worker", &at::P2pFinding::worker)
      .def_property_readonly("op", [](const at::P2pFinding& f) { return at::p2p_op_name(f.op); })
      .def_readonly("ms", &at::P2pFinding::ms)
      .def_readonly("ref_ms", &at::P2pFinding::ref_ms)
      .def_property_readonly("cause", [](const at::P2pFinding& f) { return at::p2p_cause_name(f.cause); })
      .def_readonly("blamed_worker", &at::P2pFinding::blamed_worker);

  py::class_<at::StepAttribution>(m, "StepAttribution", "What one step showed.")
      .def_property_readonly("budget_ms", [](const at::StepAttribution& s) { return s.compute.budget_ms; })
      .def_property_readonly("flags", [](const at::StepAttribution& s) { return s.compute.flags; })
      .def_property_readonly("p2p_findings", [](const at::StepAttribution& s) { return s.p2p.findings; });

  py::class_<at::Finding>(m, "Finding", "A finding unioned over the steps (times in ms).")
      .def_property_readonly("kind", [](const at::Finding& f) { return at::finding_kind_name(f.kind); })
      .def_readonly("worker", &at::Finding::worker)
      .def_readonly("peer_worker", &at::Finding::peer_worker)
      .def_readonly("pp_rank", &at::Finding::pp_rank)
      .def_readonly("stage", &at::Finding::stage)
      .def_property_readonly("op", [](const at::Finding& f) { return op_name(f.op); })
      .def_readonly("steps_flagged", &at::Finding::steps_flagged)
      .def_readonly("first_step", &at::Finding::first_step)
      .def_readonly("last_step", &at::Finding::last_step)
      .def_readonly("mean_ratio", &at::Finding::mean_ratio)
      .def_readonly("max_ratio", &at::Finding::max_ratio)
      .def_readonly("mean_excess_ms", &at::Finding::mean_excess_ms)
      .def_readonly("persistent", &at::Finding::persistent)
      .def_readonly("waits_explained", &at::Finding::waits_explained);

  py::class_<at::JumpEvent>(m, "JumpEvent", "A p2p time above jump_ratio x the worker's previous value (ms).")
      .def_readonly("step", &at::JumpEvent::step)
      .def_readonly("worker", &at::JumpEvent::worker)
      .def_property_readonly("op", [](const at::JumpEvent& j) { return at::p2p_op_name(j.op); })
      .def_readonly("ms", &at::JumpEvent::ms)
      .def_readonly("previous_ms", &at::JumpEvent::previous_ms);

  py::class_<at::BaselineOutlier>(m, "BaselineOutlier", "A worker whose mean p2p time exceeds the baseline (ms).")
      .def_readonly("worker", &at::BaselineOutlier::worker)
      .def_property_readonly("op", [](const at::BaselineOutlier& b) { return at::p2p_op_name(b.op); })
      .def_readonly("mean_ms", &at::BaselineOutlier::mean_ms)
      .def_readonly("baseline_ms", &at::BaselineOutlier::baseline_ms)
      .def_readonly("steps_abnormal", &at::BaselineOutlier::steps_abnormal)
      .def_readonly("steps_explained", &at::BaselineOutlier::steps_explained);

  py::class_<at::RunAttribution>(m, "RunAttribution", "Findings over all steps fed so far.")
      .def_readonly("steps", &at::RunAttribution::steps)
      .def_readonly("findings", &at::RunAttribution::findings)
      .def_readonly("jumps", &at::RunAttribution::jumps)
      .def_readonly("baseline_outliers", &at::RunAttribution::baseline_outliers)
      .def_readonly("slow_steps", &at::RunAttribution::slow_steps)
      .def_property_readonly(
          "late_arrivals",
          [](const at::RunAttribution& r) {
            const auto n = static_cast<py::ssize_t>(r.late_arrivals.size());
            py::array_t<std::int64_t> out(n);
            std::copy(r.late_arrivals.begin(), r.late_arrivals.end(), out.mutable_data());
            return out;
          },
          "(workers x collective stages,) steps in which each worker arrived last, worker-major.");

  py::class_<at::RunAttributor>(m, "RunAttributor",
                                "Streaming attribution over a dp x pp worker grid; worker w = pp_rank * dp + dp_rank.")
      .def(py::init([](std::int32_t dp, std::int32_t pp, std::vector<std::string> stages,
                       const at::AttributionConfig& config, std::vector<std::string> collective_stages) {
             return at::RunAttributor(at::GridShape{dp, pp}, std::move(stages), config, std::move(collective_stages));
           }),
           py::arg("dp"), py::arg("pp"), py::arg("stages"), py::arg("config"),
           py::arg("collective_stages") = std::vector<std::string>{})
      .def("add_step", &add_step, py::arg("step"), py::arg("compute_ms"), py::arg("p2p_ms") = std::nullopt,
           py::arg("step_ms") = std::numeric_limits<double>::quiet_NaN(), py::arg("collective_ms") = std::nullopt,
           "Folds one step in. compute_ms: (workers, stages) ms, NaN = not run; p2p_ms: (workers, 4) ms in\n"
           "P2P_OPS order or None; step_ms: measured step time or NaN; collective_ms: (workers,\n"
           "collective stages) ms, required when the attributor has collective stages. Raises ValueError\n"
           "on shapes.")
      .def(
          "peer_refs",
          [](const at::RunAttributor& run, const at::StepAttribution& s) { return peer_refs(s, run.shape().pp); },
          py::arg("step_attribution"), "(pp, stages) median over dp replicas of each stage for that step, ms.")
      .def("finish", &at::RunAttributor::finish, "The run so far.");
}

}  // namespace relax_straggler::python
