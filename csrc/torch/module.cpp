// relax_straggler._C: the compiled half of relax_straggler. Import it through
// relax_straggler._ext, which imports torch first and explains a missing build.
#include "bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "relax_straggler compiled core: statistics, verdicts and the sampled stage timer";
#ifdef WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  relax_straggler::torch_ext::bind_core(m);
  relax_straggler::torch_ext::bind_timer(m);
  relax_straggler::torch_ext::bind_comm(m);
  relax_straggler::torch_ext::bind_detect(m);
  relax_straggler::torch_ext::bind_attribute(m);
  relax_straggler::torch_ext::bind_ingest(m);
}
