// Sparse, sparse-compressed and nested tensors dispatch to keys opforge has no kernels for:
// without these the caller reads "Could not run 'opforge::vector_add' with arguments from the
// 'SparseCPU' backend", or an internal error from the autograd layer. Every op answers them with
// the checks' own words, naming the op and the argument.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>

#include "common/checks.h"

namespace opforge {
namespace {

void unsupported_layout(const c10::OperatorHandle& handle, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = handle.schema();
  std::string op = schema.name();  // "opforge::vector_add"
  op.replace(op.find("::"), 2, ".");
  const auto& args = schema.arguments();
  const auto first = stack->end() - static_cast<std::ptrdiff_t>(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = first[static_cast<std::ptrdiff_t>(i)];
    if (v.isTensor() && v.toTensor().defined())
      check_defined(op.c_str(), args[i].name().c_str(), v.toTensor());
  }
  TORCH_CHECK(false, op, ": the inputs must be dense (strided) tensors");
}

constexpr const char* kOps[] = {"vector_add", "nms",       "batched_nms",
                                "nms_padded", "matmul",    "preprocess_frames",
                                "copy_async", "attention", "attention_backward"};

void register_all(torch::Library& m) {
  for (const char* op : kOps) m.impl(op, torch::CppFunction::makeFromBoxedFunction<&unsupported_layout>());
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, SparseCPU, m) {
  register_all(m);
}
TORCH_LIBRARY_IMPL(opforge, SparseCUDA, m) {
  register_all(m);
}
TORCH_LIBRARY_IMPL(opforge, SparseCsrCPU, m) {
  register_all(m);
}
TORCH_LIBRARY_IMPL(opforge, SparseCsrCUDA, m) {
  register_all(m);
}
TORCH_LIBRARY_IMPL(opforge, NestedTensorCPU, m) {
  register_all(m);
}
TORCH_LIBRARY_IMPL(opforge, NestedTensorCUDA, m) {
  register_all(m);
}
TORCH_LIBRARY_IMPL(opforge, AutogradNestedTensor, m) {
  register_all(m);
}

}  // namespace opforge
