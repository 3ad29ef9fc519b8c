"""opforge.matmul: every variant against a float64 reference, shapes, dtypes, autograd, compile, errors."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICES, HAS_CUDA, poison_cuda_allocator

import opforge
from opforge import reference

# Every CUDA kernel by name, and the rungs' names that choose among them (docs/matmul.md).
FP32_CUDA_VARIANTS = [
    "naive",
    "smem_tiled",
    "register_blocked",
    "warp_tiled",
    "warp_tiled_staged",
    "warp_tiled_cp_async",
]
HALF_CUDA_VARIANTS = ["mma", "mma_cp_async", "mma_tma", "mma_ws", "wgmma"]
HALF_DTYPES = [torch.float16, torch.bfloat16]


def _build_arches() -> list[str]:
    config = opforge._loader._build_config()
    return (getattr(config, "CUDA_ARCH_LIST", None) or "").replace(" ", ";").split(";")


def runs_here(variant: str) -> bool:
    """Whether this GPU and build have the kernel's code (else the op must say what it needs)."""
    cap = torch.cuda.get_device_capability()
    arches = _build_arches()
    if variant in ("mma_tma",):
        return cap[0] == 9 and any(a.startswith("9.0") for a in arches)
    if variant in ("mma_ws", "wgmma"):
        return cap == (9, 0) and "9.0a" in arches
    if variant.startswith("mma") or variant == "warp_tiled_cp_async":
        return cap[0] >= 8
    return True


def check_or_refused(variant: str, call) -> bool:
    """Run call() when the kernel runs here (True); else assert the op refuses it clearly (False)."""
    if runs_here(variant):
        return True
    with pytest.raises(ValueError, match=rf"opforge\.matmul: variant '{variant}' needs "):
        call()
    return False


# Shapes the issue names (1, 7, 17, 127, 129, 1000, 4097 appear as m, n or k).
SHAPES = [
    (1, 1, 1),
    (7, 17, 5),
    (17, 7, 127),
    (127, 129, 1),
    (129, 127, 131),
    (1000, 64, 33),
    (33, 1000, 64),
    (64, 4097, 17),
    (200, 300, 1000),
    (65, 256, 1),  # a matrix-vector product with k a multiple of 8 (b^T is a (1, k) row)
    (70, 1, 65),  # k = 1: an outer product
]


def tolerance(dtype: torch.dtype, k: int) -> float:
    """Max error allowed, relative to sum_k |a_ik * b_kj| (the scale of the rounding errors)."""
    eps = {torch.float32: 2**-23, torch.float64: 2**-52, torch.float16: 2**-10, torch.bfloat16: 2**-7}[dtype]
    if dtype in (torch.float16, torch.bfloat16):
        return 2 * eps  # fp32 accumulation: one final rounding dominates (2x, as the issue allows)
    return 4 * eps * max(k, 1) ** 0.5 + 8 * eps


def assert_close_to_reference(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    assert got.dtype == a.dtype and got.is_contiguous()
    want = torch.matmul(a.double(), b.double())
    # Relative to the scale, and at least to the type's smallest normal: a result that lands in the
    # subnormal range is rounded to an absolute step, not a relative one.
    scale = torch.matmul(a.double().abs(), b.double().abs()).clamp(min=torch.finfo(a.dtype).tiny)
    err = ((got.double() - want).abs() / scale).max().item() if got.numel() else 0.0
    assert err <= tolerance(a.dtype, a.shape[-1]), f"relative error {err:.3g}"


def rand(shape, dtype, device):
    return torch.randn(shape, dtype=torch.float64).to(device=device, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp32_shapes(device, shape):
    m, k, n = shape
    a, b = rand((m, k), torch.float32, device), rand((k, n), torch.float32, device)
    assert_close_to_reference(opforge.matmul(a, b), a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("variant", FP32_CUDA_VARIANTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cuda_fp32_variants(variant, shape):
    m, k, n = shape
    a, b = rand((m, k), torch.float32, "cuda"), rand((k, n), torch.float32, "cuda")
    if not check_or_refused(variant, lambda: opforge.matmul(a, b, variant=variant)):
        return
    poison_cuda_allocator(4 * m * n, "cuda")  # an element the kernel misses shows up as NaN
    assert_close_to_reference(opforge.matmul(a, b, variant=variant), a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("variant", HALF_CUDA_VARIANTS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cuda_tensor_core_variants(variant, dtype, shape):
    """The tensor-core kernels; odd k and n take zero-padded copies, multiples of 8 do not, and a
    transposed view of b (x @ w.t()) is read as it is by wgmma."""
    m, k, n = shape
    a, b = rand((m, k), dtype, "cuda"), rand((k, n), dtype, "cuda")
    if not check_or_refused(variant, lambda: opforge.matmul(a, b, variant=variant)):
        return
    poison_cuda_allocator(2 * m * n, "cuda")
    assert_close_to_reference(opforge.matmul(a, b, variant=variant), a, b)
    a, b = rand((2, m, 8 * k), dtype, "cuda"), rand((2, 8 * k, 8 * n), dtype, "cuda")
    poison_cuda_allocator(2 * 2 * m * 8 * n, "cuda")
    assert_close_to_reference(opforge.matmul(a, b, variant=variant), a, b)
    w = rand((n, 8 * k), dtype, "cuda")
    x = rand((m, 8 * k), dtype, "cuda")
    poison_cuda_allocator(2 * m * n, "cuda")
    assert_close_to_reference(opforge.matmul(x, w.t(), variant=variant), x, w.t())


LARGE_SHAPES = [(1, 2056, 72, 2048), (1, 2049, 64, 2051), (3, 1100, 136, 1032), (9, 1000, 200, 1000)]
LARGE_IDS = ["n8", "odd", "batched", "rounds"]
KERNELS = [("warp_tiled_staged", torch.float32), ("warp_tiled_cp_async", torch.float32)] + [
    (v, d) for v in HALF_CUDA_VARIANTS if v != "mma" for d in HALF_DTYPES
]


@pytest.mark.cuda
@pytest.mark.parametrize("variant,dtype", KERNELS, ids=lambda x: str(x).removeprefix("torch."))
@pytest.mark.parametrize("shape", LARGE_SHAPES, ids=LARGE_IDS)
def test_cuda_large_tile_paths(variant, dtype, shape):
    """Enough output tiles for the kernels' wide configurations (wgmma: 128 x 256 tiles, stored
    by TMA when n is a multiple of 8, else by each thread; mma_tma likewise; mma_ws through a
    padded output when n is odd; warp_tiled: tiles inside the matrices read without bounds
    checks), with partial tiles at the edges; "rounds": 288 tiles of 128 x 256, so that the
    persistent kernels' blocks (one per SM) each walk 2-3 tiles across batches."""
    batch, m, k, n = shape
    a, b = rand((batch, m, k), dtype, "cuda"), rand((batch, k, n), dtype, "cuda")
    if not check_or_refused(variant, lambda: opforge.matmul(a, b, variant=variant)):
        return
    poison_cuda_allocator(a.element_size() * batch * m * n, "cuda")
    assert_close_to_reference(opforge.matmul(a, b, variant=variant), a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("variant", HALF_CUDA_VARIANTS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("k", [8, 32, 40, 64, 88, 96, 104, 128, 160, 192, 200, 1000, 4096])
def test_cuda_tensor_core_k_remainders(variant, dtype, k):
    """Every remainder of k against the k tiles (mma_tma: 96 deep, the last tile's mma stopping
    after the 32-deep pieces that hold data; mma_cp_async, mma_ws, wgmma: 64 deep), on a
    tile-edged output."""
    m, n = 136, 264
    a, b = rand((2, m, k), dtype, "cuda"), rand((2, k, n), dtype, "cuda")
    if not check_or_refused(variant, lambda: opforge.matmul(a, b, variant=variant)):
        return
    poison_cuda_allocator(2 * 2 * m * n, "cuda")
    assert_close_to_reference(opforge.matmul(a, b, variant=variant), a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("variant", HALF_CUDA_VARIANTS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_cuda_tensor_core_layouts(variant, dtype):
    """Layouts the tensor-core kernels read in place: row strides wider than the rows (slices of
    wider tensors), batch strides that are not rows x row stride (every other batch), and a
    broadcast operand (batch stride 0, which TMA cannot address: mma takes its cp.async kernel
    for it, mma_tma, mma_ws and wgmma a copy), and a broadcast row (row stride 0) likewise."""
    m, k, n = 200, 136, 264
    a = rand((3, m, k + 24), dtype, "cuda")[..., :k]
    b = rand((3, k, n + 40), dtype, "cuda")[..., :n]
    assert a.stride(-2) % 8 == 0 and b.stride(-2) % 8 == 0 and k % 8 == 0 and n % 8 == 0
    if not check_or_refused(variant, lambda: opforge.matmul(a, b, variant=variant)):
        return
    poison_cuda_allocator(2 * 3 * m * n, "cuda")
    assert_close_to_reference(opforge.matmul(a, b, variant=variant), a, b)
    a2, b2 = rand((6, m, k), dtype, "cuda")[::2], rand((6, k, n), dtype, "cuda")[::2]
    assert_close_to_reference(opforge.matmul(a2, b2, variant=variant), a2, b2)
    shared = rand((1, k, n), dtype, "cuda").expand(3, k, n)
    assert_close_to_reference(opforge.matmul(a2, shared, variant=variant), a2, shared)
    shared_a = rand((1, m, k), dtype, "cuda").expand(3, m, k)
    assert_close_to_reference(opforge.matmul(shared_a, b2, variant=variant), shared_a, b2)
    row = rand((k,), dtype, "cuda").expand(m, k)  # every row the same: row stride 0
    b1 = rand((k, n), dtype, "cuda")
    poison_cuda_allocator(2 * m * n, "cuda")
    assert_close_to_reference(opforge.matmul(row, b1, variant=variant), row, b1)
    same_rows = rand((n,), dtype, "cuda").expand(k, n)  # b's rows all the same: row stride 0
    a1 = rand((m, k), dtype, "cuda")
    assert_close_to_reference(opforge.matmul(a1, same_rows, variant=variant), a1, same_rows)


@pytest.mark.cuda
@pytest.mark.parametrize("variant", ["warp_tiled", "warp_tiled_staged", "warp_tiled_cp_async"])
@pytest.mark.parametrize("shape", [(300, 70, 261), (129, 33, 6), (2, 257, 130, 514)], ids=str)
def test_cuda_warp_tiled_padded_views(variant, shape):
    """Column slices of wider tensors: row strides multiples of 4 floats (16-byte rows) but k and
    n not, so warp_tiled's cp.async copies at the edges read short chunks and zero-fill the rest;
    warp_tiled_cp_async also takes a padded output for c's odd rows."""
    *batch, m, k, n = shape
    a = rand((*batch, m, (k + 3) // 4 * 4 + 4), torch.float32, "cuda")[..., :k]
    b = rand((*batch, k, (n + 3) // 4 * 4 + 4), torch.float32, "cuda")[..., :n]
    assert a.stride(-2) % 4 == 0 and b.stride(-2) % 4 == 0 and k % 4 and n % 4
    if not check_or_refused(variant, lambda: opforge.matmul(a, b, variant=variant)):
        return
    poison_cuda_allocator(4 * m * n * (batch[0] if batch else 1), "cuda")
    assert_close_to_reference(opforge.matmul(a, b, variant=variant), a, b)


ALL_CUDA_KERNELS = [(v, torch.float32) for v in FP32_CUDA_VARIANTS] + [
    (v, d) for v in HALF_CUDA_VARIANTS for d in HALF_DTYPES
]


@pytest.mark.cuda
@pytest.mark.parametrize("variant,dtype", ALL_CUDA_KERNELS, ids=lambda x: str(x).removeprefix("torch."))
@pytest.mark.parametrize(
    "shape", [(2, 300, 136, 520), (1, 129, 33, 70), (1, 1100, 136, 2056)], ids=["tiles", "padded", "wide"]
)
def test_cuda_graph_capture(variant, dtype, shape):
    """Every kernel captured in a CUDA graph (the persistent and TMA launches, their tensor maps
    and the launcher's padded copies included; "wide": wgmma's 128 x 256 tiles stored by TMA)
    and replayed on new data in the same buffers."""
    batch, m, k, n = shape
    a, b = rand((batch, m, k), dtype, "cuda"), rand((batch, k, n), dtype, "cuda")
    if not check_or_refused(variant, lambda: opforge.matmul(a, b, variant=variant)):
        return
    opforge.matmul(a, b, variant=variant)  # warm up outside the capture (kernel attributes)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = opforge.matmul(a, b, variant=variant)
    for _ in range(2):
        a.copy_(rand(a.shape, dtype, "cuda"))
        b.copy_(rand(b.shape, dtype, "cuda"))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert_close_to_reference(out, a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("variant,dtype", ALL_CUDA_KERNELS, ids=lambda x: str(x).removeprefix("torch."))
def test_cuda_side_stream(variant, dtype):
    """The kernel runs on the current stream: on a side stream it must see the copy queued before
    it there behind a long sleep (a launch on another stream would read the stale input)."""
    a, b = rand((2, 300, 136), dtype, "cuda"), rand((2, 136, 520), dtype, "cuda")
    if not check_or_refused(variant, lambda: opforge.matmul(a, b, variant=variant)):
        return
    opforge.matmul(a, b, variant=variant)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        a2 = torch.zeros_like(a)
        torch.cuda._sleep(20_000_000)
        a2.copy_(a)
        got = opforge.matmul(a2, b, variant=variant)
    s.synchronize()
    assert_close_to_reference(got, a, b)


OTHER_DTYPES = [("cpu", torch.float64), ("cpu", torch.float16), ("cpu", torch.bfloat16)] + [
    pytest.param("cuda", d, marks=pytest.mark.cuda) for d in HALF_DTYPES
]  # (float64 on CUDA is refused: test_errors_cuda)


@pytest.mark.parametrize("device,dtype", OTHER_DTYPES, ids=str)
def test_other_dtypes(device, dtype):
    a, b = rand((3, 70, 129), dtype, device), rand((3, 129, 33), dtype, device)
    got = opforge.matmul(a, b)
    assert_close_to_reference(got, a, b)
    if dtype != torch.float64:  # within 2x of torch.matmul's own error against the exact product
        want = torch.matmul(a.double(), b.double())
        ours = (got.double() - want).abs().max().item()
        theirs = (torch.matmul(a, b).double() - want).abs().max().item()
        assert ours <= 2 * theirs + 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_reference_is_exact_on_small_integers(dtype):
    """The oracle itself: on small integers every product and sum is exact in every dtype, so
    reference.matmul must equal the sums of products counted one by one in Python."""
    a = torch.randint(-4, 5, (2, 5, 7)).to(dtype)
    b = torch.randint(-4, 5, (2, 7, 3)).to(dtype)
    got = reference.matmul(a, b)
    assert got.dtype == dtype and got.shape == (2, 5, 3)
    al, bl = a.tolist(), b.tolist()
    want = [
        [[sum(al[z][i][t] * bl[z][t][j] for t in range(7)) for j in range(3)] for i in range(5)]
        for z in range(2)
    ]
    assert got.tolist() == want


@pytest.mark.parametrize("device", DEVICES)
def test_batched_transposed_and_strided(device):
    a = rand((4, 50, 70), torch.float32, device)
    b = rand((4, 90, 70), torch.float32, device).transpose(1, 2)  # (4, 70, 90), column-major
    assert_close_to_reference(opforge.matmul(a, b), a, b)
    at_ = rand((33, 65), torch.float32, device).t()  # (65, 33) transposed
    bt = rand((40, 33), torch.float32, device).t()
    assert_close_to_reference(opforge.matmul(at_, bt), at_, bt)
    wide = rand((64, 200), torch.float32, device)[:, ::2]  # (64, 100), stride 2
    b2 = rand((100, 30), torch.float32, device)
    assert_close_to_reference(opforge.matmul(wide, b2), wide, b2)
    expanded = rand((1, 20, 30), torch.float32, device).expand(3, 20, 30)  # batch stride 0
    b3 = rand((3, 30, 10), torch.float32, device)
    assert_close_to_reference(opforge.matmul(expanded, b3), expanded, b3)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_k_zero(device):
    a, b = torch.empty(5, 0, device=device), torch.empty(0, 7, device=device)
    out = opforge.matmul(a, b)
    assert out.shape == (5, 7) and (out == 0).all()
    assert opforge.matmul(torch.empty(0, 3, device=device), torch.randn(3, 4, device=device)).shape == (0, 4)
    assert opforge.matmul(torch.empty(2, 0, 3, device=device), torch.randn(2, 3, 4, device=device)).shape == (
        2,
        0,
        4,
    )
    for dtype in (torch.float32, torch.bfloat16):  # an empty batch (the tensor-core rungs on CUDA)
        a, b = (
            torch.empty(0, 3, 8, device=device, dtype=dtype),
            torch.empty(0, 8, 16, device=device, dtype=dtype),
        )
        assert opforge.matmul(a, b).shape == (0, 3, 16)


def test_gradcheck():
    """float64, so on the CPU (CUDA computes float32 and 16-bit types: test_backward_matches_torch)."""
    a = rand((5, 7), torch.float64, "cpu").requires_grad_()
    b = rand((7, 3), torch.float64, "cpu").requires_grad_()
    assert torch.autograd.gradcheck(lambda x, y: opforge.matmul(x, y), (a, b))
    a3 = rand((2, 4, 6), torch.float64, "cpu").requires_grad_()
    b3 = rand((2, 6, 5), torch.float64, "cpu").requires_grad_()
    assert torch.autograd.gradcheck(lambda x, y: opforge.matmul(x, y), (a3, b3))


@pytest.mark.parametrize("device", DEVICES)
def test_backward_matches_torch(device):
    a = rand((30, 40), torch.float32, device).requires_grad_()
    b = rand((40, 20), torch.float32, device).requires_grad_()
    g = rand((30, 20), torch.float32, device)
    opforge.matmul(a, b).backward(g)
    da, db = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    torch.matmul(a, b).backward(g)
    torch.testing.assert_close(da, a.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(db, b.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    samples = [
        (rand((5, 7), torch.float32, device), rand((7, 3), torch.float32, device)),
        (rand((2, 4, 6), torch.float32, device).requires_grad_(), rand((2, 6, 5), torch.float32, device)),
        (rand((9, 4), torch.float32, device).t(), rand((9, 3), torch.float32, device)),
    ]
    samples.append((rand((3, 8), torch.bfloat16, device), rand((8, 2), torch.bfloat16, device)))
    for a, b in samples:
        torch.library.opcheck(torch.ops.opforge.matmul.default, (a, b), {"variant": "auto"})


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile(device):
    def f(x, y):
        return torch.relu(opforge.matmul(x, y)) * 2

    compiled = torch.compile(f, fullgraph=True)
    a, b = rand((16, 32), torch.float32, device), rand((32, 8), torch.float32, device)
    torch.testing.assert_close(compiled(a, b), f(a, b))


def test_errors():
    a, b = torch.randn(4, 5), torch.randn(5, 6)
    with pytest.raises(
        RuntimeError, match=r"opforge\.matmul: a must be 2-D \(m, k\) or 3-D \(batch, m, k\), got 1-D"
    ):
        opforge.matmul(torch.randn(4), b)
    with pytest.raises(
        RuntimeError, match=r"opforge\.matmul: b must have as many dimensions as a \(2\), got 3-D"
    ):
        opforge.matmul(a, torch.randn(1, 5, 6))
    with pytest.raises(
        RuntimeError, match=r"opforge\.matmul: inner dimensions differ: a is \[4, 5\] and b is \[4, 6\]"
    ):
        opforge.matmul(a, torch.randn(4, 6))
    with pytest.raises(RuntimeError, match=r"opforge\.matmul: b must have a's batch size \(2\), got 3"):
        opforge.matmul(torch.randn(2, 4, 5), torch.randn(3, 5, 6))
    with pytest.raises(
        RuntimeError, match=r"opforge\.matmul: b must have the same dtype as a \(float32\), got float64"
    ):
        opforge.matmul(a, b.double())
    with pytest.raises(
        RuntimeError,
        match=r"opforge\.matmul: a must be one of \(float32, float64, float16, bfloat16\), got int64",
    ):
        opforge.matmul(a.long(), b.long())
    with pytest.raises(
        ValueError, match=r"opforge\.matmul: unknown variant 'fast'; the variants are: auto, naive"
    ):
        opforge.matmul(a, b, variant="fast")
    with pytest.raises(
        ValueError,
        match=r"opforge\.matmul: variant 'wgmma' runs on CUDA tensors; on the CPU the variants are: auto",
    ):
        opforge.matmul(a, b, variant="wgmma")
    with pytest.raises(TypeError, match=r"opforge\.matmul: b must be a torch\.Tensor, got list"):
        opforge.matmul(a, [[1.0]])


def test_one_exception_type_per_condition():
    """The wrapper, the raw op and its fake kernel (FakeTensorMode, meta tensors) raise the same
    type with the same words: RuntimeError for tensors that do not fit, ValueError for an unknown
    variant."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    a, b = torch.randn(4, 5), torch.randn(5, 6)
    cases = [
        (RuntimeError, (a, torch.randn(4, 6), "auto"), r"opforge\.matmul: inner dimensions differ"),
        (RuntimeError, (torch.randn(2, 4, 5), torch.randn(3, 5, 6), "auto"), r"b must have a's batch size"),
        (RuntimeError, (a, b.double(), "auto"), r"opforge\.matmul: b must have the same dtype as a"),
        (ValueError, (a, b, "fast"), r"opforge\.matmul: unknown variant 'fast'; the variants are: auto"),
    ]
    raw = torch.ops.opforge.matmul.default
    for err, (x, y, variant), msg in cases:
        with pytest.raises(err, match=msg) as wrapper:
            opforge.matmul(x, y, variant=variant)
        with pytest.raises(err) as real:
            raw(x, y, variant=variant)
        with FakeTensorMode() as mode, pytest.raises(err) as fake:
            raw(mode.from_tensor(x), mode.from_tensor(y), variant=variant)
        with pytest.raises(err) as meta:
            raw(x.to("meta"), y.to("meta"), variant=variant)
        assert str(wrapper.value) == str(real.value) == str(fake.value) == str(meta.value)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and a CUDA build of opforge")
def test_errors_cuda():
    a, b = torch.randn(4, 5, device="cuda"), torch.randn(5, 6, device="cuda")
    with pytest.raises(
        RuntimeError, match=r"opforge\.matmul: b must be on the same device as a \(cuda:0\), got cpu"
    ):
        opforge.matmul(a, b.cpu())
    fp32 = "auto, naive, smem_tiled, register_blocked, warp_tiled, warp_tiled_staged, warp_tiled_cp_async"
    for v in HALF_CUDA_VARIANTS:
        with pytest.raises(
            ValueError,
            match=rf"opforge\.matmul: variant '{v}' cannot serve float32; for float32 on CUDA the variants are: {fp32}$",
        ):
            opforge.matmul(a, b, variant=v)
    half = "auto, mma, mma_cp_async, mma_tma, mma_ws, wgmma"
    for v in FP32_CUDA_VARIANTS:
        with pytest.raises(
            ValueError,
            match=rf"opforge\.matmul: variant '{v}' cannot serve bfloat16; for bfloat16 on CUDA the variants are: {half}$",
        ):
            opforge.matmul(a.bfloat16(), b.bfloat16(), variant=v)
    with pytest.raises(NotImplementedError, match=r"opforge\.matmul: float64 is computed on the CPU only"):
        opforge.matmul(a.double(), b.double())


@pytest.mark.parametrize("device", DEVICES)
def test_error_none_nested_sparse(device):
    x = torch.ones(3, 3, device=device)
    with pytest.raises(RuntimeError, match=r"opforge\.matmul: b must be a tensor, got None"):
        torch.ops.opforge.matmul(x, None)
    with pytest.raises(RuntimeError, match=r"opforge\.matmul: a must be a tensor, got None"):
        torch.ops.opforge.matmul(None, x)
    nested = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)], device=device)
    with pytest.raises(
        RuntimeError, match=r"opforge\.matmul: a must be a dense \(strided\) tensor, got a nested"
    ):
        opforge.matmul(nested, nested)
    with pytest.raises(
        RuntimeError,
        match=r"opforge\.matmul: b must be a dense \(strided\) tensor, got a tensor of layout Sparse",
    ):
        opforge.matmul(x, x.to_sparse())


def test_torch_func_transforms():
    """grad, vjp, jacrev, jacfwd, jvp, vmap (2-D and batched operands, one unmapped), hessian and
    forward-mode AD through opforge.matmul, against the same transforms of torch.matmul."""
    import torch.autograd.forward_ad as fwad

    a, b = rand((3, 4), torch.float64, "cpu"), rand((4, 5), torch.float64, "cpu")
    w = rand((3, 5), torch.float64, "cpu")
    torch.testing.assert_close(torch.func.grad(lambda x: (opforge.matmul(x, b) * w).sum())(a), w @ b.T)
    _, pull = torch.func.vjp(opforge.matmul, a, b)
    da, db = pull(w)
    torch.testing.assert_close(da, w @ b.T)
    torch.testing.assert_close(db, a.T @ w)
    for jac in (torch.func.jacrev, torch.func.jacfwd):
        torch.testing.assert_close(
            jac(opforge.matmul, argnums=(0, 1))(a, b), jac(torch.matmul, argnums=(0, 1))(a, b)
        )
    ta, tb = torch.randn_like(a), torch.randn_like(b)
    _, tangent = torch.func.jvp(opforge.matmul, (a, b), (ta, tb))
    torch.testing.assert_close(tangent, ta @ b + a @ tb)
    xs, ys = rand((6, 3, 4), torch.float64, "cpu"), rand((6, 4, 5), torch.float64, "cpu")
    torch.testing.assert_close(torch.func.vmap(opforge.matmul)(xs, ys), xs @ ys)
    torch.testing.assert_close(torch.func.vmap(opforge.matmul, in_dims=(0, None))(xs, b), xs @ b)
    x4, y4 = rand((2, 6, 3, 4), torch.float64, "cpu"), rand((2, 6, 4, 5), torch.float64, "cpu")
    torch.testing.assert_close(torch.func.vmap(opforge.matmul)(x4, y4), x4 @ y4)
    torch.testing.assert_close(
        torch.func.hessian(lambda x: (opforge.matmul(x, b) ** 2).sum())(a),
        torch.func.hessian(lambda x: ((x @ b) ** 2).sum())(a),
    )
    with fwad.dual_level():
        out = opforge.matmul(fwad.make_dual(a, ta), b)
        torch.testing.assert_close(fwad.unpack_dual(out).tangent, ta @ b)
