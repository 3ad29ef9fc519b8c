// preprocess_frames: C++ entry (through the dispatcher), input checks and the plan.
#include "preprocess_frames/preprocess_frames.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/checks.h"
#include "opforge.h"

namespace opforge {

namespace {
constexpr const char* kOp = "opforge.preprocess_frames";

// Whether c / d == fma(fma(-q, d, c), inv, q) with q = c * inv for every c a uint8 value
// normalizes to (each operation rounded once, as the CUDA kernel computes it).
bool reciprocal_is_exact(const PreprocessParams& p, int k) {
  for (int v = 0; v < 256; ++v) {
    const float c = centered_exact(static_cast<float>(v), p, k);
    const float want = normalize_exact(static_cast<float>(v), p, k);
    volatile float q = c * p.inv_std[k];
    const float got = std::fma(std::fma(-q, p.std[k], c), p.inv_std[k], q);
    if (std::memcmp(&got, &want, sizeof(float)) != 0) return false;
  }
  return true;
}

// A float32 value as the output type's bits (round to nearest even, as the kernels store it).
uint32_t output_bits(float v, DType t) {
  if (t == DType::kFloat16) return c10::Half(v).x;
  if (t == DType::kBFloat16) return c10::BFloat16(v).x;
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// Whether a float32 value rounds to a finite value of the output type, and the type's largest.
bool finite_in(float v, at::ScalarType t) {
  if (t == at::kHalf) return std::isfinite(static_cast<float>(c10::Half(v)));
  if (t == at::kBFloat16) return std::isfinite(static_cast<float>(c10::BFloat16(v)));
  return std::isfinite(v);
}
float largest(at::ScalarType t) {
  if (t == at::kHalf) return std::numeric_limits<c10::Half>::max();
  if (t == at::kBFloat16) return std::numeric_limits<c10::BFloat16>::max();
  return std::numeric_limits<float>::max();
}

// Whether fma(v, a, b) rounds to the same output value as the exact chain for every uint8 v.
bool affine_is_exact(const PreprocessParams& p, int k, float a, float b) {
  for (int v = 0; v < 256; ++v) {
    const float want = normalize_exact(static_cast<float>(v), p, k);
    if (output_bits(std::fma(static_cast<float>(v), a, b), p.out_dtype) != output_bits(want, p.out_dtype))
      return false;
  }
  return true;
}

// Looks for (a, b) near (scale / std, -mean / std) that normalize every uint8 value of channel k
// exactly with one fused multiply-add; false when none of the few candidates does.
bool find_affine(PreprocessParams& p, int k) {
  const double d = p.has_std ? static_cast<double>(p.std[k]) : 1.0;
  const float a0 = static_cast<float>(static_cast<double>(p.scale) / d);
  const float b0 = static_cast<float>(-static_cast<double>(p.mean[k]) / d);
  for (int da : {0, 1, -1}) {
    float a = a0;
    for (int i = 0; i < std::abs(da); ++i) a = std::nextafter(a, da > 0 ? INFINITY : -INFINITY);
    for (int db : {0, 1, -1, 2, -2}) {
      float b = b0;
      for (int i = 0; i < std::abs(db); ++i) b = std::nextafter(b, db > 0 ? INFINITY : -INFINITY);
      if (std::isfinite(a) && std::isfinite(b) && affine_is_exact(p, k, a, b)) {
        p.affine_a[k] = a;
        p.affine_b[k] = b;
        return true;
      }
    }
  }
  return false;
}
// The parameters that decide the kernels' arithmetic, and what was decided for them.
struct ArithmeticKey {
  float values[7];  // scale, mean, std (compared bit for bit)
  bool has_std, cuda_convert;
  DType out_dtype;
  bool operator==(const ArithmeticKey& o) const {
    return std::memcmp(values, o.values, sizeof(values)) == 0 && has_std == o.has_std &&
           cuda_convert == o.cuda_convert && out_dtype == o.out_dtype;
  }
};
struct Arithmetic {
  ArithmeticKey key;
  bool exact_reciprocal, affine;
  float affine_a[3], affine_b[3];
};

// Sets p.exact_reciprocal and, for the CUDA kernel without a resize (which reads only uint8 values)
// writing fp16 or bf16, p.affine. Each check tries all 256 values per channel; a stream of calls
// with the same parameters (the common case) reuses this thread's last answer.
void choose_arithmetic(PreprocessParams& p, bool cuda) {
  ArithmeticKey key{};
  key.values[0] = p.scale;
  std::copy(p.mean, p.mean + 3, key.values + 1);
  std::copy(p.std, p.std + 3, key.values + 4);
  key.has_std = p.has_std;
  key.cuda_convert = cuda && !p.resize && p.out_dtype != DType::kFloat32;
  key.out_dtype = key.cuda_convert ? p.out_dtype : DType::kFloat32;
  thread_local bool cached = false;
  thread_local Arithmetic last;
  if (!cached || !(last.key == key)) {
    p.exact_reciprocal =
        p.has_std && reciprocal_is_exact(p, 0) && reciprocal_is_exact(p, 1) && reciprocal_is_exact(p, 2);
    p.affine = key.cuda_convert && find_affine(p, 0) && find_affine(p, 1) && find_affine(p, 2);
    last.key = key;
    last.exact_reciprocal = p.exact_reciprocal;
    last.affine = p.affine;
    std::copy(p.affine_a, p.affine_a + 3, last.affine_a);
    std::copy(p.affine_b, p.affine_b + 3, last.affine_b);
    cached = true;
    return;
  }
  p.exact_reciprocal = last.exact_reciprocal;
  p.affine = last.affine;
  std::copy(last.affine_a, last.affine_a + 3, p.affine_a);
  std::copy(last.affine_b, last.affine_b + 3, p.affine_b);
}
}  // namespace

float centered_exact(float v, const PreprocessParams& p, int k) {
  volatile float scaled = v * p.scale;  // volatile: never contracted into a fused multiply-add
  return scaled - p.mean[k];
}

float normalize_exact(float v, const PreprocessParams& p, int k) {
  volatile float centered = centered_exact(v, p, k);
  return p.has_std ? centered / p.std[k] : centered;
}

void check_preprocess_frames_inputs(const at::Tensor& frames, c10::IntArrayRef out_size,
                                    c10::IntArrayRef region, double scale, c10::ArrayRef<double> mean,
                                    c10::ArrayRef<double> std, double pad_value, c10::IntArrayRef channels,
                                    at::ScalarType out_dtype) {
  // One exception type per condition (docs/adding-an-op.md, section 3), as the wrapper and the fake
  // kernel raise them: frames that do not fit -> RuntimeError (TORCH_CHECK); the other arguments'
  // values -> ValueError (TORCH_CHECK_VALUE).
  check_defined(kOp, "frames", frames);
  TORCH_CHECK(frames.scalar_type() == at::kByte, kOp, ": frames must be uint8, got ",
              dtype_str(frames.scalar_type()));
  TORCH_CHECK(frames.dim() == 4, kOp, ": frames must be 4-D (N, H, W, C), got ", frames.dim(), "-D");
  const int64_t c = frames.size(3);
  TORCH_CHECK(c == 3 || c == 4, kOp, ": frames must have 3 or 4 channels (last dim), got ", c);
  TORCH_CHECK(frames.numel() > 0 || frames.size(0) == 0, kOp,
              ": frames must have a height and width of at least 1, got ", frames.sizes());
  TORCH_CHECK_VALUE(out_size.size() == 2, kOp, ": size must be (height, width), got ", out_size.size(),
                    " values");
  TORCH_CHECK_VALUE(out_size[0] > 0 && out_size[1] > 0, kOp, ": size must be positive, got ", out_size);
  TORCH_CHECK_VALUE(region.size() == 4, kOp, ": region must be (top, left, height, width), got ",
                    region.size(), " values");
  TORCH_CHECK_VALUE(region[2] > 0 && region[3] > 0 && region[0] >= 0 && region[1] >= 0 &&
                        region[0] + region[2] <= out_size[0] && region[1] + region[3] <= out_size[1],
                    kOp, ": region ", region, " must lie inside the output size ", out_size);
  // The kernels compute in float32: the numbers must be float32 ones (1e-50 rounds to 0, 1e39 to inf).
  TORCH_CHECK_VALUE(std::isfinite(static_cast<float>(scale)), kOp,
                    ": scale must be finite in float32 (the kernels compute in float32), got ", scale);
  TORCH_CHECK_VALUE(mean.empty() || mean.size() == 3, kOp,
                    ": mean must have 3 values (one per output channel), got ", mean.size());
  TORCH_CHECK_VALUE(std.empty() || std.size() == 3, kOp,
                    ": std must have 3 values (one per output channel), got ", std.size());
  for (double m : mean)
    TORCH_CHECK_VALUE(std::isfinite(static_cast<float>(m)), kOp,
                      ": mean must be finite in float32 (the kernels compute in float32), got ", mean);
  for (double s : std)
    TORCH_CHECK_VALUE(std::isfinite(static_cast<float>(s)) && static_cast<float>(s) != 0.0f, kOp,
                      ": std must be finite and nonzero in float32 (the kernels compute in float32), got ",
                      std);
  TORCH_CHECK_VALUE(pad_value >= 0.0 && pad_value <= 255.0, kOp,
                    ": pad_value must be a pixel value in [0, 255], got ", pad_value);
  const bool same_order = channels.size() == 3 && channels[0] == 0 && channels[1] == 1 && channels[2] == 2;
  const bool reversed = channels.size() == 3 && channels[0] == 2 && channels[1] == 1 && channels[2] == 0;
  TORCH_CHECK_VALUE(
      same_order || reversed, kOp,
      ": channels (the input channel of each output channel) must be [0, 1, 2] or [2, 1, 0], got ", channels);
  TORCH_CHECK_VALUE(out_dtype == at::kHalf || out_dtype == at::kBFloat16 || out_dtype == at::kFloat, kOp,
                    ": out_dtype must be one of (float16, bfloat16, float32), got ", dtype_str(out_dtype));
  TORCH_CHECK(frames.size(1) < (int64_t{1} << 31) && frames.size(2) < (int64_t{1} << 31), kOp,
              ": frame sides must be below 2^31");
  TORCH_CHECK_VALUE(out_size[0] < (int64_t{1} << 31) && out_size[1] < (int64_t{1} << 31), kOp,
                    ": size must be below 2^31, got ", out_size);
  // Every output is (v * scale - mean[k]) / std[k] in float32 (normalize_exact, as the plan and the
  // kernels compute it), rounded once to out_dtype. That is monotonic in v, so pixel values 0 and
  // 255 bound it: the pad value (in [0, 255]) and bilinear blends (in [0, 255] up to a float32
  // rounding) normalize to values between theirs.
  PreprocessParams p;
  p.scale = static_cast<float>(scale);
  p.has_std = !std.empty();
  for (int k = 0; k < 3; ++k) {
    if (!mean.empty()) p.mean[k] = static_cast<float>(mean[k]);
    if (p.has_std) p.std[k] = static_cast<float>(std[k]);
  }
  for (int k = 0; k < 3; ++k) {
    for (float v : {0.0f, 255.0f}) {
      const float out = normalize_exact(v, p, k);
      TORCH_CHECK_VALUE(finite_in(out, out_dtype), kOp,
                        ": scale, mean and std must keep the normalized pixel values (0 to 255, and "
                        "pad_value) finite in float32 and within ",
                        dtype_str(out_dtype), "'s range (largest ", largest(out_dtype), "), got ", out,
                        " for pixel value ", v, " in output channel ", k);
    }
  }
}

PreprocessPlan plan_preprocess_frames(const at::Tensor& frames, c10::IntArrayRef out_size,
                                      c10::IntArrayRef region, double scale, c10::ArrayRef<double> mean,
                                      c10::ArrayRef<double> std, double pad_value, c10::IntArrayRef channels,
                                      at::ScalarType out_dtype) {
  PreprocessPlan plan;
  plan.out = at::empty({frames.size(0), 3, out_size[0], out_size[1]}, frames.options().dtype(out_dtype));
  PreprocessParams& p = plan.params;
  p.in = frames.const_data_ptr<uint8_t>();
  p.n = frames.size(0);
  p.h = frames.size(1);
  p.w = frames.size(2);
  p.c = frames.size(3);
  p.s_n = frames.stride(0);
  p.s_h = frames.stride(1);
  p.s_w = frames.stride(2);
  p.s_c = frames.stride(3);
  p.out = plan.out.data_ptr();
  p.out_h = out_size[0];
  p.out_w = out_size[1];
  p.out_dtype = to_dtype(out_dtype);
  p.top = region[0];
  p.left = region[1];
  p.rh = region[2];
  p.rw = region[3];
  p.resize = p.rh != p.h || p.rw != p.w;
  // PyTorch's bilinear source scale: input / output in float (align_corners=False, no scale factor).
  p.src_per_dst_y = static_cast<float>(p.h) / static_cast<float>(p.rh);
  p.src_per_dst_x = static_cast<float>(p.w) / static_cast<float>(p.rw);
  p.scale = static_cast<float>(scale);
  p.has_std = !std.empty();
  for (int k = 0; k < 3; ++k) {
    p.ch[k] = static_cast<int>(channels[k]);
    p.mean[k] = mean.empty() ? 0.0f : static_cast<float>(mean[k]);
    p.std[k] = std.empty() ? 1.0f : static_cast<float>(std[k]);
    p.pad[k] = normalize_exact(static_cast<float>(pad_value), p, k);
    p.inv_std[k] = 1.0f / p.std[k];
  }
  choose_arithmetic(p, frames.is_cuda());
  return plan;
}

at::Tensor preprocess_frames(const at::Tensor& frames, c10::IntArrayRef size, c10::IntArrayRef region,
                             double scale, c10::ArrayRef<double> mean, c10::ArrayRef<double> std,
                             double pad_value, c10::IntArrayRef channels, at::ScalarType out_dtype) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opforge::preprocess_frames", "")
                       .typed<at::Tensor(const at::Tensor&, c10::IntArrayRef, c10::IntArrayRef, double,
                                         c10::ArrayRef<double>, c10::ArrayRef<double>, double,
                                         c10::IntArrayRef, at::ScalarType)>();
  return op.call(frames, size, region, scale, mean, std, pad_value, channels, out_dtype);
}

}  // namespace opforge
