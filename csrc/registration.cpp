// Every opforge schema, in one place. Kernels register themselves in their backend files
// (TORCH_LIBRARY_IMPL(opforge, CPU|CUDA, m)); Python adds fake kernels and autograd.
#include <torch/library.h>

TORCH_LIBRARY(opforge, m) {
  m.def("vector_add(Tensor a, Tensor b) -> Tensor");
}
