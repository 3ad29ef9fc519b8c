// matmul CPU: checks -> variant -> tasks over the output (batch x row blocks x column blocks)
// -> the blocked GEMM of the CPU variant (common/cpu/gemm_impl.h) on each, in parallel.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/cpu/gemm.h"
#include "common/cpu_isa.h"
#include "matmul/matmul.h"

namespace opforge {
namespace {

constexpr int64_t kRowAlign = 6 * 24;  // task edges on whole a blocks (kMC)
constexpr int64_t kColAlign = 16 * 8;  // ... and whole b panels

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

at::Tensor matmul_cpu(const at::Tensor& a, const at::Tensor& b, c10::string_view variant) {
  check_matmul_inputs(a, b);
  const MatmulVariant v = parse_matmul_variant(variant);
  TORCH_CHECK_VALUE(v == MatmulVariant::kAuto, "opforge.matmul: variant '", matmul_variant_name(v),
                    "' runs on CUDA tensors; on the CPU the variants are: auto");
  const bool half = a.scalar_type() == at::kHalf || a.scalar_type() == at::kBFloat16;
  // 16-bit inputs accumulate into a float32 result that is rounded once at the end.
  at::Tensor out =
      at::empty(matmul_output_shape(a, b), a.options().dtype(half ? at::kFloat : a.scalar_type()));
  const at::Tensor a3 = as_batched(a), b3 = as_batched(b), c3 = as_batched(out);
  const GemmParams p = gemm_params(a3, b3, c3);
  if (p.m > 0 && p.n > 0) {
    const CpuIsa isa = cpu_isa();
    const GemmBlockFn gemm = gemm_block(p.dtype, isa);
    const int64_t work_bytes = gemm_work_bytes(p.dtype, isa);
    // Enough tasks for every thread: split the batch first, then the longer of m and n, on
    // block boundaries (a split of n repacks a, a split of m repacks b).
    const int64_t threads = at::get_num_threads();
    int64_t m_parts = 1, n_parts = 1;
    while (p.batch * m_parts * n_parts < threads) {
      const bool split_n = ceil_div(p.n, n_parts * kColAlign) >= ceil_div(p.m, m_parts * kRowAlign);
      if (split_n && ceil_div(p.n, kColAlign) > n_parts)
        ++n_parts;
      else if (ceil_div(p.m, kRowAlign) > m_parts)
        ++m_parts;
      else
        break;
    }
    const int64_t m_step = ceil_div(ceil_div(p.m, m_parts), 6) * 6,
                  n_step = ceil_div(ceil_div(p.n, n_parts), 16) * 16;
    const int64_t tasks = p.batch * m_parts * n_parts;
    // A little work is not worth a thread: calls below 128^3 multiply-adds in all (about 40 us
    // on one core) run on the caller. A parallel region can cost a scheduler tick when the other
    // cores are busy (benchmarks/tuning/common/cpu_neighbour.py).
    const int64_t grain = p.batch * p.m * p.n * std::max<int64_t>(p.k, 1) < (1 << 21) ? tasks : 1;
    at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
      c10::DataPtr work = c10::GetCPUAllocator()->allocate(static_cast<size_t>(work_bytes));
      for (int64_t t = begin; t < end; ++t) {
        const int64_t bi = t / (m_parts * n_parts), rest = t % (m_parts * n_parts);
        const int64_t m0 = (rest / n_parts) * m_step, n0 = (rest % n_parts) * n_step;
        gemm(p, bi, m0, std::min(p.m, m0 + m_step), n0, std::min(p.n, n0 + n_step), work.get());
      }
    });
  }
  return half ? out.to(a.scalar_type()) : out;
}

}  // namespace

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("matmul", &matmul_cpu);
}

}  // namespace opforge
