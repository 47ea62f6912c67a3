// Registration functions of the relax_straggler._C extension (the LibTorch glue), one
// per concern; the module definition (module.cpp) calls each. The torch-free engine's
// bindings are in csrc/python (relax_straggler._core).
#pragma once

#include <pybind11/pybind11.h>

namespace relax_straggler::torch_ext {

void bind_timer(pybind11::module_& m);  // StageTimer, StepSample, Section
void bind_comm(pybind11::module_& m);   // TimedBackend: wrap / unwrap a ProcessGroup's backend, its progress

}  // namespace relax_straggler::torch_ext
