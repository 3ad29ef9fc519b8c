// Calls opforge's ops from C++ through the public header, on the CPU (and on CUDA when a GPU and
// a CUDA build are there), and checks them against torch's own.
#include <opforge.h>
#include <torch/torch.h>

#include <iostream>

namespace {

bool check(const torch::Device& device) {
  const auto opts = torch::TensorOptions().device(device);
  const torch::Tensor a = torch::randn({1000, 37}, opts);
  const torch::Tensor b = torch::randn({37, 1000}, opts).t();  // non-contiguous works too
  const torch::Tensor out = opforge::vector_add(a, b);
  const bool ok = torch::equal(out, a + b);
  const torch::Tensor head = out[0].slice(0, 0, 3).cpu();
  std::cout << "opforge::vector_add on " << device << ": " << out.sizes() << " "
            << (ok ? "matches" : "DIFFERS FROM") << " torch::add; out[0][:3] = " << head[0].item<float>()
            << ", " << head[1].item<float>() << ", " << head[2].item<float>() << "\n";
  return ok;
}

}  // namespace

// Three boxes: the second overlaps the first (IoU 0.81 > 0.5) and is suppressed.
bool check_nms(const torch::Device& device) {
  const auto opts = torch::TensorOptions().device(device);
  const torch::Tensor boxes =
      torch::tensor({0.f, 0.f, 10.f, 10.f, 1.f, 1.f, 10.f, 10.f, 20.f, 20.f, 30.f, 30.f}, opts)
          .reshape({3, 4});
  const torch::Tensor scores = torch::tensor({0.9f, 0.8f, 0.7f}, opts);
  const torch::Tensor keep = opforge::nms(boxes, scores, 0.5).cpu();
  bool ok = keep.numel() == 2 && keep[0].item<int64_t>() == 0 && keep[1].item<int64_t>() == 2;
  // The same without a host sync: (keep padded with -1, count); idxs optional, last.
  const auto [padded, count] = opforge::nms_padded(boxes, scores, 0.5);
  ok = ok && count.item<int64_t>() == 2 && padded.cpu()[2].item<int64_t>() == -1;
  const auto [by_class, count_by_class] =
      opforge::nms_padded(boxes, scores, 0.5, torch::tensor({0, 1, 1}, opts.dtype(torch::kLong)));
  ok = ok && count_by_class.item<int64_t>() == 3;  // different classes never suppress each other
  std::cout << "opforge::nms and nms_padded on " << device << ": kept " << keep.numel() << " boxes "
            << (ok ? "(expected)" : "(WRONG)") << "\n";
  return ok;
}

// c = a @ b with opforge's GEMM (and, for a float input that requires grad, its C++ autograd).
bool check_matmul(const torch::Device& device) {
  const auto opts = torch::TensorOptions().device(device);
  const torch::Tensor a = torch::randn({200, 300}, opts).requires_grad_();
  const torch::Tensor b = torch::randn({300, 100}, opts);
  const torch::Tensor c = opforge::matmul(a, b);
  c.sum().backward();
  const bool ok = torch::allclose(c, torch::matmul(a, b), 1e-4, 1e-4) &&
                  torch::allclose(a.grad(), torch::ones({200, 100}, opts).matmul(b.t()), 1e-4, 1e-4);
  std::cout << "opforge::matmul on " << device << ": " << c.sizes() << (ok ? " matches" : " DIFFERS FROM")
            << " torch::matmul (and its gradient)\n";
  return ok;
}

int main() {
  torch::manual_seed(0);
  bool ok = check(torch::kCPU) && check_nms(torch::kCPU) && check_matmul(torch::kCPU);
  if (torch::cuda::is_available())
    ok = check(torch::kCUDA) && check_nms(torch::kCUDA) && check_matmul(torch::kCUDA) && ok;
  try {
    opforge::vector_add(torch::ones({3}), torch::ones({4}));
    ok = false;
  } catch (const c10::Error& e) {
    std::cout << "bad input raises: " << e.what_without_backtrace() << "\n";
  }
  std::cout << (ok ? "opforge C++ example OK" : "opforge C++ example FAILED") << std::endl;
  return ok ? 0 : 1;
}
