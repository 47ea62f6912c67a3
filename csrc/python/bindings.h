// Registration functions of the torch-free extension relax_straggler._core (pybind11
// bindings of csrc/core), one per concern; module.cpp calls each. Nothing here includes
// torch, so the offline analysis and the monitor service load without it.
#pragma once

#include <pybind11/pybind11.h>

namespace relax_straggler::python {

void bind_core(pybind11::module_& m);       // statistics and per-step verdicts (csrc/core)
void bind_detect(pybind11::module_& m);     // window detector: six clusterers and votes (submodule detect)
void bind_attribute(pybind11::module_& m);  // offline attribution: RunAttributor (csrc/core/attribute)
void bind_ingest(pybind11::module_& m);     // input scanners: TimerLogScanner (csrc/core/ingest)
void bind_whatif(pybind11::module_& m);     // what-if slowdown simulator (submodule whatif, csrc/core/whatif)

}  // namespace relax_straggler::python
