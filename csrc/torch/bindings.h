// Registration functions of the relax_straggler._C extension, one per concern; the
// module definition (module.cpp) calls each.
#pragma once

#include <pybind11/pybind11.h>

namespace relax_straggler::torch_ext {

void bind_core(pybind11::module_& m);   // statistics and per-step verdicts (csrc/core)
void bind_timer(pybind11::module_& m);  // StageTimer, StepSample, Section
void bind_comm(pybind11::module_& m);   // TimedBackend: wrap / unwrap a ProcessGroup's backend
void bind_detect(pybind11::module_& m);  // window detector: six clusterers and votes (submodule detect)
void bind_attribute(pybind11::module_& m);  // offline attribution: RunAttributor (csrc/core/attribute)
void bind_ingest(pybind11::module_& m);     // input scanners: TimerLogScanner (csrc/core/ingest)

}  // namespace relax_straggler::torch_ext
