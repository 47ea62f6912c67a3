// Python bindings of the collective layer: wrapping a ProcessGroup's backend and reading
// its per-group progress counters.
#include <torch/csrc/utils/pybind.h>

#include <chrono>

#include "bindings.h"
#include "group_progress.h"
#include "timed_backend.h"

namespace py = pybind11;

namespace relax_straggler::torch_ext {
namespace {

py::object entry_dict(const ProgressEntry& e) {
  if (e.seq == 0) return py::none();
  py::dict d;
  d["seq"] = e.seq;
  d["op"] = kProgressOpNames.at(static_cast<std::size_t>(e.op));
  d["ns"] = e.ns;
  return d;
}

// Mean ns of one GroupProgress::enter on this thread over `iterations` calls: the cost the
// counters add to every collective on a non-sampled step (benchmarks/collective_cost.py).
double progress_cost_ns(std::int64_t iterations) {
  if (iterations < 1) throw std::invalid_argument("iterations must be >= 1");
  GroupProgress progress;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < iterations; ++i) progress.enter(ProgressOp::kAllreduce);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(iterations);
}

}  // namespace

void bind_comm(py::module_& m) {
  m.def("wrap_process_group", &wrap_process_group, py::arg("group"), py::arg("device"), py::arg("timer"),
        py::arg("comparable"),
        "Times `group`'s collectives on `device` ('cpu', 'cuda') into `timer` on sampled steps.\n"
        "comparable: the group spans every analyzed rank. Returns False (and changes nothing)\n"
        "for a backend c10d does not know by type.");
  m.def("unwrap_process_group", &unwrap_process_group, py::arg("group"), py::arg("device"),
        "Restores `group`'s original backend on `device`; returns whether it was wrapped.");
  m.def("is_wrapped", &is_wrapped, py::arg("group"), py::arg("device"));

  py::class_<GroupProgress, std::shared_ptr<GroupProgress>>(
      m, "GroupProgress", "How far one wrapped process group got on this rank (read from any thread).")
      .def(
          "snapshot",
          [](const GroupProgress& p) {
            const ProgressSnapshot s = p.snapshot();
            py::dict d;
            d["collective"] = entry_dict(s.collective);
            d["p2p"] = entry_dict(s.p2p);
            d["completed"] = entry_dict(s.completed);
            return d;
          },
          "{'collective', 'p2p', 'completed'}: each None or {'seq', 'op', 'ns'} (ns on coarse_now_ns()'s\n"
          "clock): the last collective and send/recv entered, each numbered from 1 in its own sequence,\n"
          "and the last op seen completed.");
  m.def("progress_of", &progress_of, py::arg("group"), py::arg("device"),
        "The GroupProgress of `group`'s wrapped backend on `device`, or None when it is not wrapped.");
  m.def("coarse_now_ns", &coarse_now_ns, "CLOCK_MONOTONIC_COARSE in ns: the clock of the progress times.");
  m.def("progress_cost_ns", &progress_cost_ns, py::arg("iterations"),
        "Mean ns the progress counters add to one collective (a benchmark probe). Raises ValueError\n"
        "for iterations < 1.");
}

}  // namespace relax_straggler::torch_ext
