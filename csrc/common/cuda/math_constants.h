// The shared CUDA layer's mathematical constants, one definition each. The kernels' softmax runs in
// the log2 domain (exp2 by ex2.approx, one instruction): scores are scaled by log2(e), and a row's LSE
// comes back to the natural log by ln(2); a masked score is -inf. Plain C++ without CUDA headers, so that the
// host code that derives the kernels' factors (attention_cuda.cpp) and the CPU build's checks of them
// (attention.cpp) take the same constants.
#pragma once

namespace opforge {
namespace cuda {

constexpr double kLog2e = 1.4426950408889634;  // log2(e)
constexpr double kLn2 = 0.6931471805599453;    // ln(2) = 1 / log2(e)
// The nearest floats, as the kernels use them.
constexpr float kLog2eFloat = static_cast<float>(kLog2e);
constexpr float kLn2Float = static_cast<float>(kLn2);
// -inf as a float: a masked score (exp2 gives 0), the max of a row that has seen nothing.
constexpr float kNegInf = -__builtin_huge_valf();

}  // namespace cuda
}  // namespace opforge
