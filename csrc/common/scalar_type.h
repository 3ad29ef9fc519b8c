// Torch-free element types shared by launchers and device code.
#pragma once

#include <cstdint>

namespace opforge {

// The element types opforge's kernels are written for. Device code (.cu files) switches on
// this instead of including torch; the launcher maps at::ScalarType onto it.
enum class DType : int8_t { kFloat32, kFloat64, kFloat16, kBFloat16 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

}  // namespace opforge
