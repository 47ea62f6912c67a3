// Python bindings of the sampled stage timer and its Section context manager.
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "cupti/section_observer.h"
#include "stage_timer.h"

namespace py = pybind11;

namespace relax_straggler::torch_ext {
namespace {

// `with timer.section(id):` — a reusable context manager bound to one stage. On a
// non-sampled step __enter__/__exit__ return after one atomic load in StageTimer.
class Section {
 public:
  Section(std::shared_ptr<StageTimer> timer, int stage) : timer_(std::move(timer)), stage_(stage) {}
  void enter() { timer_->start(stage_); }
  void exit() { timer_->stop(stage_); }
  int stage() const { return stage_; }

 private:
  std::shared_ptr<StageTimer> timer_;
  int stage_;
};

// The observer a capsule from relax_straggler._core.kernels carries (section_observer.h).
// Raises TypeError for anything else.
SectionObserver observer_of(const py::object& capsule) {
  if (!PyCapsule_IsValid(capsule.ptr(), kSectionObserverCapsule)) {
    throw py::type_error(std::string("set_section_observer: expected a capsule named '") + kSectionObserverCapsule +
                         "' (relax_straggler._core.kernels), got " + py::repr(capsule).cast<std::string>());
  }
  return *static_cast<SectionObserver*>(PyCapsule_GetPointer(capsule.ptr(), kSectionObserverCapsule));
}

}  // namespace

void bind_timer(py::module_& m) {
  py::class_<StepSample>(m, "StepSample", "One rank's measurements for one step (per stage id; ms).")
      .def_readonly("step", &StepSample::step)
      .def_readonly("sampled", &StepSample::sampled)
      .def_readonly("device_ms", &StepSample::device_ms)
      .def_readonly("host_ms", &StepSample::host_ms)
      .def_readonly("waited_ms", &StepSample::waited_ms)
      .def_readonly("calls", &StepSample::calls)
      .def_readonly("comm_op_ms", &StepSample::comm_op_ms)
      .def_readonly("comm_op_calls", &StepSample::comm_op_calls)
      .def_readonly("comm_op_bytes", &StepSample::comm_op_bytes)
      .def_readonly("comm_total_ms", &StepSample::comm_total_ms)
      .def_readonly("wait_total_ms", &StepSample::wait_total_ms)
      .def_readonly("comparable_ms", &StepSample::comparable_ms)
      .def_readonly("comm_incomplete", &StepSample::comm_incomplete)
      .def_readonly("untimed_ms", &StepSample::untimed_ms,
                    "host wall time of the step outside every section, collective and wait, ms (NaN: unknown)");

  py::enum_<CommOp>(m, "CommOp", "Collective kinds; the first seven are the communication/<op> stages.")
      .value("ALLREDUCE", CommOp::kAllreduce)
      .value("REDUCE_SCATTER", CommOp::kReduceScatter)
      .value("ALLGATHER", CommOp::kAllgather)
      .value("BROADCAST", CommOp::kBroadcast)
      .value("ALLTOALL", CommOp::kAlltoall)
      .value("SEND", CommOp::kSend)
      .value("RECV", CommOp::kRecv)
      .value("OTHER", CommOp::kOther);
  m.attr("MAX_COMPARABLE_COLLECTIVES") = kMaxComparableCollectives;

  py::class_<Section>(m, "Section")
      .def("__enter__", [](Section& s) { s.enter(); return &s; }, py::return_value_policy::reference)
      .def("__exit__", [](Section& s, const py::args&) { s.exit(); return false; })
      .def_property_readonly("stage", &Section::stage);

  py::class_<StageTimer, std::shared_ptr<StageTimer>>(m, "StageTimer",
                                                      "Sampled, bounded, synchronize-free stage timer (stage_timer.h).")
      .def(py::init<int, std::int64_t, std::int64_t, std::size_t, bool>(), py::arg("num_stages"), py::arg("interval"),
           py::arg("warmup_steps") = 0, py::arg("max_events") = 4096, py::arg("use_cuda") = false)
      .def("begin_step", &StageTimer::begin_step, py::arg("step"))
      .def("start", &StageTimer::start, py::arg("stage"))
      .def("stop", &StageTimer::stop, py::arg("stage"))
      .def("end_step", &StageTimer::end_step)
      .def("comm_begin", &StageTimer::comm_begin, py::arg("op"), py::arg("comparable"), py::arg("bytes") = 0)
      .def("comm_end", &StageTimer::comm_end, py::arg("token"), py::arg("blocking") = false)
      .def("wait_begin", &StageTimer::wait_begin)
      .def("wait_end", &StageTimer::wait_end, py::arg("token"))
      .def("section",
           [](const std::shared_ptr<StageTimer>& t, int stage) {
             if (stage < 0 || stage >= t->num_stages()) throw py::index_error("stage id out of range");
             return Section(t, stage);
           },
           py::arg("stage"))
      .def_property_readonly("sampled", &StageTimer::sampled)
      .def_property_readonly("num_stages", &StageTimer::num_stages)
      .def_property_readonly("interval", &StageTimer::interval)
      .def("set_interval", &StageTimer::set_interval, py::arg("interval"),
           "Samples every interval-th step from the next begin_step on. Raises ValueError when < 1.")
      // The capsule stays referenced by the timer (keep_alive): the observer's context lives
      // at least as long as the timer may call it.
      .def(
          "set_section_observer",
          [](StageTimer& t, const py::object& capsule) { t.set_section_observer(observer_of(capsule)); },
          py::arg("observer"), py::keep_alive<1, 2>(),
          "Calls the observer in `observer` (a capsule from relax_straggler._core.kernels) at each begin and end "
          "of a section timed on a sampled step. Raises TypeError for any other object.")
      .def(
          "clear_section_observer", [](StageTimer& t) { t.set_section_observer(SectionObserver{}); },
          "No observer from now on.")
      .def_property_readonly("has_section_observer", &StageTimer::has_section_observer)
      .def_property_readonly("last_sections", &StageTimer::last_sections,
                             "(stage id, device ms) of the sections completed in the last sampled step read, "
                             "in the order they ended.")
      .def_property_readonly("device", &StageTimer::device)
      .def_property_readonly("read_points", &StageTimer::read_points)
      .def_property_readonly("events_recorded", &StageTimer::events_recorded)
      .def_property_readonly("dropped_sections", &StageTimer::dropped_sections)
      .def_property_readonly("dropped_collectives", &StageTimer::dropped_collectives)
      .def_property_readonly("unmatched_stops", &StageTimer::unmatched_stops)
      .def_property_readonly("open_at_step_end", &StageTimer::open_at_step_end);
}

}  // namespace relax_straggler::torch_ext
