// Input checks shared by every op. Each message names the op and the argument, e.g.
// "opforge.vector_add: b must have the same dtype as a (float32), got float16".
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <string>

#include "common/scalar_type.h"
#include "common/strided.h"

namespace opforge {

// "float32" rather than "Float": the names Python users write.
inline std::string dtype_str(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kFloat8_e4m3fn:
      return "float8_e4m3fn";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(t);
  }
}

inline DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kDouble:
      return DType::kFloat64;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kFloat8_e4m3fn:
      return DType::kFloat8E4M3;
    default:
      TORCH_CHECK(false, "opforge: internal error, no kernel type for ", dtype_str(t));
  }
}

// What a sparse, sparse-compressed or nested tensor is, for messages.
inline std::string layout_str(const at::Tensor& t) {
  if (t.is_nested()) return "a nested tensor";
  std::string layout = c10::str(t.layout());  // "Sparse", "SparseCsr", ...
  return "a tensor of layout " + layout;
}

// A defined, dense (strided) tensor: the kernels read strided memory only. (Sparse and nested
// tensors that reach no kernel of ours are answered with the same words: common/layouts.cpp.)
inline void check_defined(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": ", arg, " must be a tensor, got None");
  TORCH_CHECK(!t.is_nested() && t.layout() == at::kStrided, op, ": ", arg,
              " must be a dense (strided) tensor, got ", layout_str(t));
}

inline void check_dtype_in(const char* op, const char* arg, const at::Tensor& t,
                           std::initializer_list<at::ScalarType> allowed) {
  for (auto s : allowed)
    if (t.scalar_type() == s) return;
  std::string names;
  for (auto s : allowed) names += (names.empty() ? "" : ", ") + dtype_str(s);
  TORCH_CHECK(false, op, ": ", arg, " must be one of (", names, "), got ", dtype_str(t.scalar_type()));
}

inline void check_same_dtype(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                             const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", arg, " must have the same dtype as ", ref_arg,
              " (", dtype_str(ref.scalar_type()), "), got ", dtype_str(t.scalar_type()));
}

inline void check_same_device(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                              const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), op, ": ", arg, " must be on the same device as ", ref_arg, " (",
              ref.device().str(), "), got ", t.device().str());
}

inline void check_same_shape(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                             const at::Tensor& ref) {
  TORCH_CHECK(t.sizes().equals(ref.sizes()), op, ": ", arg, " must have the same shape as ", ref_arg, " ",
              ref.sizes(), ", got ", t.sizes());
}

// The elementwise iteration space of `out` and its inputs (operand 0 is `out`), collapsed.
// Returns false when the layout keeps more than kMaxDims dims after collapsing.
template <int N>
bool geometry_of(std::initializer_list<const at::Tensor*> operands, Geometry<N>& g) {
  const at::Tensor& out = **operands.begin();
  const int64_t* strides[N];
  int i = 0;
  for (const at::Tensor* t : operands) strides[i++] = t->strides().data();
  return make_geometry<N>(static_cast<int>(out.dim()), out.sizes().data(), strides, g);
}

}  // namespace opforge
