// Registration functions of the torch-free extension relax_straggler._core (pybind11
// bindings of csrc/core), one per concern; module.cpp calls each. Nothing here includes
// torch, so the offline analysis and the monitor service load without it.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/step_matrix.h"

namespace relax_straggler::python {

using DoubleArray = pybind11::array_t<double, pybind11::array::c_style | pybind11::array::forcecast>;

// A StepMatrix copied from a (ranks, stages) float64 array in ms (bind_core.cpp). Throws
// std::invalid_argument (ValueError) on a shape that is not 2-D or whose column count is not
// stages.size(). Call with the GIL held; release it for the work on the copy.
core::StepMatrix step_matrix(const DoubleArray& ms, std::vector<std::string> stages, std::int64_t step);

void bind_core(pybind11::module_& m);       // statistics and per-step verdicts (csrc/core)
void bind_detect(pybind11::module_& m);     // window detector: six clusterers and votes (submodule detect)
void bind_attribute(pybind11::module_& m);  // offline attribution: RunAttributor (csrc/core/attribute)
void bind_ingest(pybind11::module_& m);     // input scanners: TimerLogScanner (csrc/core/ingest)
void bind_confirm(pybind11::module_& m);    // confirmed verdict across reports (submodule confirm)
void bind_whatif(pybind11::module_& m);     // what-if slowdown simulator (submodule whatif, csrc/core/whatif)
void bind_kernel_stats(pybind11::module_& m);  // kernel records and their cause (submodule kernels, csrc/cupti)

}  // namespace relax_straggler::python
