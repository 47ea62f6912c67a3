// Registration functions of the relax_straggler._C extension, one per concern; the
// module definition (module.cpp) calls each.
#pragma once

#include <pybind11/pybind11.h>

namespace relax_straggler::torch_ext {

void bind_core(pybind11::module_& m);   // statistics and per-step verdicts (csrc/core)
void bind_timer(pybind11::module_& m);  // StageTimer, StepSample, Section

}  // namespace relax_straggler::torch_ext
