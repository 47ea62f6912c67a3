// relax_straggler._C: the LibTorch half of relax_straggler (stage timer, c10d wrapper).
// Import it through relax_straggler._ext.ext(), which imports torch first and explains a
// missing build.
#include "bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "relax_straggler LibTorch glue: the sampled stage timer and the timed collective backend";
#ifdef WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  relax_straggler::torch_ext::bind_timer(m);
  relax_straggler::torch_ext::bind_comm(m);
}
