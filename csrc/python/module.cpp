// relax_straggler._core: the torch-free engine for Python. Import it through
// relax_straggler._ext.core(), which explains a missing build.
#include "bindings.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "relax_straggler engine: statistics, verdicts, window detection, attribution and input scanners";
  relax_straggler::python::bind_core(m);
  relax_straggler::python::bind_detect(m);
  relax_straggler::python::bind_attribute(m);
  relax_straggler::python::bind_ingest(m);
  relax_straggler::python::bind_confirm(m);
  relax_straggler::python::bind_whatif(m);
  relax_straggler::python::bind_kernel_stats(m);
}
