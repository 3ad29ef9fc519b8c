// Torch-free element types shared by launchers and device code.
#pragma once

#include <cstdint>

namespace opforge {

// The element types opforge's kernels are written for. Device code (.cu files) switches on
// this instead of including torch; the launcher maps at::ScalarType onto it.
enum class DType : int8_t { kFloat32, kFloat64, kFloat16, kBFloat16, kFloat8E4M3 };

}  // namespace opforge
