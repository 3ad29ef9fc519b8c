// opforge: the public C++ API. Each function calls the PyTorch dispatcher, so C++ users get
// the same CPU/CUDA dispatch, autograd (when the Python package registered it) and checks as
// Python users of torch.ops.opforge.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

#include <optional>
#include <tuple>

namespace opforge {

// out = a + b, elementwise. a and b: same shape, dtype (float32/float64/float16/bfloat16) and
// device; any strides. The output is empty_like(a): a's memory layout when a is dense, else a
// dense one in a's stride order.
at::Tensor vector_add(const at::Tensor& a, const at::Tensor& b);

// Non-maximum suppression with torchvision's contract: boxes (N, 4) as (x1, y1, x2, y2), scores (N,);
// returns the int64 indices of the kept boxes by decreasing score (equal scores: lower index
// first). A box is suppressed by a kept, higher-scoring box when their IoU > iou_threshold.
at::Tensor nms(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold);

// NMS within each class idxs[i] (any integer dtype); boxes of different classes never suppress
// each other. Indices of the kept boxes by decreasing score, across classes.
at::Tensor batched_nms(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
                       double iou_threshold);

// nms (or batched_nms with idxs) without a device->host synchronisation: keep has N entries,
// the kept indices first and -1 after them; num_kept is a 0-d int64 tensor.
std::tuple<at::Tensor, at::Tensor> nms_padded(const at::Tensor& boxes, const at::Tensor& scores,
                                              double iou_threshold,
                                              const std::optional<at::Tensor>& idxs = std::nullopt);

// c = a @ b: a (m, k) and b (k, n), or batched (batch, m, k) and (batch, k, n); float32, float64,
// float16 or bfloat16 (16-bit: fp32 accumulation, rounded once); any strides. `variant` names the
// kernel ("auto": the fastest that can serve the call; on CUDA also "naive", "smem_tiled",
// "register_blocked", "warp_tiled" for float32 and "mma", "wgmma" for 16-bit types).
at::Tensor matmul(const at::Tensor& a, const at::Tensor& b, c10::string_view variant = "auto");

// Video frames to a model's input: frames uint8 (N, H, W, C), C = 3 or 4 (alpha ignored), any
// strides -> (N, 3, size[0], size[1]) of out_dtype (float16, bfloat16, float32). The frame, resized
// bilinearly (PyTorch's align_corners=False sampling) to region's (height, width), lands at
// region's (top, left); the rest is pad_value (a pixel value). Every value v is normalized as
// (v * scale - mean[c]) / std[c] (mean, std: 3 values or empty = 0 and 1). channels = {0, 1, 2}
// keeps the channel order, {2, 1, 0} reverses it (BGR <-> RGB). One pass over memory.
at::Tensor preprocess_frames(const at::Tensor& frames, c10::IntArrayRef size, c10::IntArrayRef region,
                             double scale, c10::ArrayRef<double> mean, c10::ArrayRef<double> std,
                             double pad_value, c10::IntArrayRef channels, at::ScalarType out_dtype);

// dst <- src (same shape and dtype; CPU or CUDA on either side) on the current CUDA stream, without
// synchronizing the host: from pinned host memory and between devices fully asynchronous; from
// pageable memory staged through pinned memory (the call returns after that host copy). Returns dst.
at::Tensor& copy_async(at::Tensor& dst, const at::Tensor& src);

// A copy of src on `device` made with copy_async (src's layout when src is dense; pinned memory when
// the device is the CPU and src is on a GPU).
at::Tensor to_device_async(const at::Tensor& src, at::Device device);

// Attention of q (B, Hq, Sq, D) over k, v (B, Hkv, Sk, D) with a pattern (csrc/attention/attention_params.h):
// (out (B, Hq, Sq, D), lse (B, Hq, Sq)). The Python opforge.attention builds the arguments. `variant`
// names the kernel ("auto", "tiled" / "decode" on the CPU, "decode" / "hopper" / "mma_sync" on CUDA:
// docs/attention.md); one that cannot serve the call raises a ValueError saying why. `deterministic` is
// the backward's (the forward is always deterministic): the autograd of the Python API reads it here.
// cu_seqlens_q / cu_seqlens_k (int32 (B + 1,)): q, k, v hold B variable-length sequences packed along
// their sequence dim in a batch of one (the Python opforge.attention_varlen takes (total, H, D)).
// check_offsets false: on CUDA the offsets are not read on the host (no synchronization; the caller
// vouches for them: the kernels clamp them into the tensors, bad ones give undefined results); the
// CPU checks them either way. sinks (Hq,): attention sinks, a logit each query head's rows take in
// their softmax with no value (gpt-oss).
std::tuple<at::Tensor, at::Tensor> attention(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, double softcap = 0.0,
    bool causal = false, int64_t window_left = -1, int64_t window_right = -1, int64_t prefix_len = 0,
    const std::optional<at::Tensor>& q_segments = std::nullopt,
    const std::optional<at::Tensor>& kv_segments = std::nullopt,
    const std::optional<at::Tensor>& mask_kinds = std::nullopt,
    const std::optional<at::Tensor>& mask_index = std::nullopt,
    const std::optional<at::Tensor>& mask_bits = std::nullopt, int64_t block_q = 128, int64_t block_k = 128,
    const std::optional<at::Tensor>& kv_lens = std::nullopt, c10::string_view variant = "auto",
    std::optional<bool> deterministic = std::nullopt,
    const std::optional<at::Tensor>& cu_seqlens_q = std::nullopt,
    const std::optional<at::Tensor>& cu_seqlens_k = std::nullopt, bool check_offsets = true,
    const std::optional<at::Tensor>& sinks = std::nullopt);

}  // namespace opforge
