// Python bindings of the collective layer: wrapping a ProcessGroup's backend.
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "timed_backend.h"

namespace py = pybind11;

namespace relax_straggler::torch_ext {

void bind_comm(py::module_& m) {
  m.def("wrap_process_group", &wrap_process_group, py::arg("group"), py::arg("device"), py::arg("timer"),
        py::arg("comparable"),
        "Times `group`'s collectives on `device` ('cpu', 'cuda') into `timer` on sampled steps.\n"
        "comparable: the group spans every analyzed rank. Returns False (and changes nothing)\n"
        "for a backend c10d does not know by type.");
  m.def("unwrap_process_group", &unwrap_process_group, py::arg("group"), py::arg("device"),
        "Restores `group`'s original backend on `device`; returns whether it was wrapped.");
  m.def("is_wrapped", &is_wrapped, py::arg("group"), py::arg("device"));
}

}  // namespace relax_straggler::torch_ext
