// Python bindings of the what-if simulator (csrc/core/whatif): WhatIfModel built from
// per-op record columns (numpy arrays), analyze() returning a WhatIfResult, give_back() for
// any worker x op-type set and timeline() for the simulated timeline. The GIL is released
// while the engine builds and replays.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "bindings.h"
#include "core/whatif/analysis.h"
#include "core/whatif/model.h"
#include "core/whatif/replay.h"
#include "core/whatif/synthetic.h"

namespace py = pybind11;
namespace wi = relax_straggler::core::whatif;

namespace relax_straggler::python {
namespace {

template <typename T>
using Col = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <typename T>
const T* column(const Col<T>& a, const char* name, py::ssize_t n) {
  if (a.ndim() != 1 || a.shape(0) != n) {
    throw std::invalid_argument(std::string(name) + " must be 1-D with " + std::to_string(n) + " entries");
  }
  return a.data();
}

wi::WhatIfModel build(const Col<std::int32_t>& dp_rank, const Col<std::int32_t>& stage, const Col<std::int64_t>& step,
                      const Col<std::int32_t>& optype, const Col<double>& start, const Col<double>& duration,
                      const Col<std::int32_t>& seq_id, const Col<std::int32_t>& microbatch,
                      const Col<std::int32_t>& chunk, const std::vector<std::string>& optype_names) {
  std::vector<wi::OpRole> roles;
  for (const auto& name : optype_names) {
    wi::OpRole r;
    if (!wi::role_from_name(name, &r)) throw std::invalid_argument("op type '" + name + "' has no what-if role");
    roles.push_back(r);
  }
  const py::ssize_t n = dp_rank.shape(0);
  const auto* d = column(dp_rank, "dp_rank", n);
  const auto* s = column(stage, "stage", n);
  const auto* st = column(step, "step", n);
  const auto* t = column(optype, "optype", n);
  const auto* b = column(start, "start", n);
  const auto* du = column(duration, "duration", n);
  const auto* q = column(seq_id, "seq_id", n);
  const auto* mb = column(microbatch, "microbatch", n);
  const auto* mc = column(chunk, "chunk", n);
  py::gil_scoped_release release;
  // Read in place: the columns outlive the call (forcecast copies only a column of another type).
  return wi::build_model(wi::OpColumns{static_cast<std::size_t>(n), d, s, st, t, b, du, q, mb, mc}, roles);
}

wi::Selection selection(const std::vector<std::uint8_t>& workers, const std::vector<std::uint8_t>& optypes) {
  return {false, workers, optypes};
}

py::dict give_back_dict(const wi::GiveBack& g) {
  py::dict d;
  d["t_ori"] = g.t_ori, d["t_ideal"] = g.t_ideal, d["t_rem"] = g.t_rem, d["t_add"] = g.t_add;
  d["rem"] = g.rem, d["add"] = g.add;
  return d;
}

}  // namespace

void bind_whatif(py::module_& m) {
  auto w = m.def_submodule("whatif", "What-if slowdown simulator (OSDI'25 straggler study)");
  py::class_<wi::WhatIfModel>(w, "WhatIfModel", "Dependency model and per-op durations of a job (times in s).")
      .def(py::init(&build), py::arg("dp_rank"), py::arg("stage"), py::arg("step"), py::arg("optype"),
           py::arg("start"), py::arg("duration"), py::arg("seq_id"), py::arg("microbatch"), py::arg("chunk"),
           py::arg("optype_names"),
           "Columns of one record per op (start/duration in s); optype indexes optype_names (Megatron timer "
           "names). Raises ValueError naming the record or missing op.")
      .def_property_readonly("dp_ranks", [](const wi::WhatIfModel& x) { return x.dp_ranks; })
      .def_property_readonly("steps", [](const wi::WhatIfModel& x) { return x.steps; })
      .def_property_readonly("pp", &wi::WhatIfModel::pp)
      .def_property_readonly("ideal", [](const wi::WhatIfModel& x) { return x.ideal; }, "per op type, s")
      .def_property_readonly("slot_stage", [](const wi::WhatIfModel& x) { return x.graph.slot_stage; })
      .def_property_readonly("slot_optype", [](const wi::WhatIfModel& x) { return x.graph.slot_optype; })
      .def_property_readonly("slot_seq", [](const wi::WhatIfModel& x) { return x.graph.slot_seq; })
      .def_property_readonly("num_ops", [](const wi::WhatIfModel& x) { return x.recorded.size(); })
      .def(
          "analyze",
          [](const wi::WhatIfModel& x, const std::vector<std::int32_t>& groups, double top_fraction, bool by_worker,
             int threads) {
            wi::WhatIfOptions o{groups, top_fraction, by_worker, threads};
            py::gil_scoped_release release;
            return wi::analyze(x, o);
          },
          py::arg("optype_group") = std::vector<std::int32_t>{}, py::arg("top_fraction") = 0.03,
          py::arg("by_worker") = true, py::arg("threads") = 0)
      .def(
          "give_back",
          [](const wi::WhatIfModel& x, const std::vector<std::uint8_t>& workers, const std::vector<std::uint8_t>& optypes,
             double t_ori, double t_ideal) {
            if (!workers.empty() && workers.size() != static_cast<std::size_t>(x.dp) * x.pp()) {
              throw std::invalid_argument("workers mask must have dp x pp entries (lane * pp + stage)");
            }
            if (!optypes.empty() && optypes.size() != x.optype_roles.size()) {
              throw std::invalid_argument("optypes mask must have one entry per op type");
            }
            wi::GiveBack g;
            {
              py::gil_scoped_release release;
              g = wi::give_back(x, selection(workers, optypes), t_ori, t_ideal);
            }
            return give_back_dict(g);
          },
          py::arg("workers"), py::arg("optypes"), py::arg("t_ori"), py::arg("t_ideal"),
          "rem/add of setting the selected ops (workers[lane * pp + stage] and optypes[t]) to ideal.")
      .def(
          "timeline",
          [](const wi::WhatIfModel& x, bool ideal) {
            std::vector<double> s, e;
            {
              py::gil_scoped_release release;
              wi::replay_timeline(x, {!ideal, wi::Selection::nothing()}, &s, &e);
            }
            return py::make_tuple(py::array_t<double>(s.size(), s.data()), py::array_t<double>(e.size(), e.data()));
          },
          py::arg("ideal") = true,
          "(start, end) in s from each step's start, shape (steps * slots * dp,), index (step * slots + slot) * dp + lane.");

  py::class_<wi::GiveBack>(w, "GiveBack", "Fixing a set of ops: mean step times (s) and rem/add fractions.")
      .def_readonly("t_ori", &wi::GiveBack::t_ori)
      .def_readonly("t_ideal", &wi::GiveBack::t_ideal)
      .def_readonly("t_rem", &wi::GiveBack::t_rem)
      .def_readonly("t_add", &wi::GiveBack::t_add)
      .def_readonly("rem", &wi::GiveBack::rem)
      .def_readonly("add", &wi::GiveBack::add);

  py::class_<wi::WhatIfResult>(w, "WhatIfResult", "Slowdown S, attribution S_i, M_W, M_S (step times in s).")
      .def_readonly("measured_step_s", &wi::WhatIfResult::measured_step_s)
      .def_readonly("replayed_step_s", &wi::WhatIfResult::replayed_step_s)
      .def_readonly("ideal_step_s", &wi::WhatIfResult::ideal_step_s)
      .def_readonly("slowdown", &wi::WhatIfResult::slowdown)
      .def_readonly("slowdown_per_step", &wi::WhatIfResult::slowdown_per_step)
      .def_readonly("simulation_error", &wi::WhatIfResult::simulation_error)
      .def_readonly("by_dp", &wi::WhatIfResult::by_dp)
      .def_readonly("by_stage", &wi::WhatIfResult::by_stage)
      .def_readonly("by_group", &wi::WhatIfResult::by_group)
      .def_readonly("by_worker", &wi::WhatIfResult::by_worker)
      .def_readonly("by_dp_per_step", &wi::WhatIfResult::by_dp_per_step)
      .def_readonly("by_stage_per_step", &wi::WhatIfResult::by_stage_per_step)
      .def_readonly("by_group_per_step", &wi::WhatIfResult::by_group_per_step)
      .def_readonly("top_workers", &wi::WhatIfResult::top_workers)
      .def_readonly("m_w", &wi::WhatIfResult::m_w)
      .def_readonly("m_s", &wi::WhatIfResult::m_s);

  w.def(
      "synthetic_model",
      [](std::int32_t dp, std::int32_t pp, std::int32_t microbatches, std::int32_t steps, std::uint64_t seed,
         std::int32_t slow_dp, std::int32_t slow_stage, double slow_factor) {
        py::gil_scoped_release release;
        return wi::synthetic_model({dp, pp, microbatches, steps, seed, slow_dp, slow_stage, slow_factor});
      },
      py::arg("dp"), py::arg("pp"), py::arg("microbatches"), py::arg("steps"), py::arg("seed") = 0,
      py::arg("slow_dp") = -1, py::arg("slow_stage") = -1, py::arg("slow_factor") = 1.0,
      "A synthetic 1F1B job built directly in the engine (benchmarks): forward ~10 ms, backward ~20 ms, "
      "+-5 % noise; the worker (slow_dp, slow_stage) computes slow_factor x slower.");
}

}  // namespace relax_straggler::python
