"""opforge.vector_add: results, layouts, dtypes, autograd, compile, streams, errors."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICES, poison_cuda_allocator
from torch.testing import assert_close

import opforge
from opforge import reference

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SHAPES = [(), (0,), (1,), (7,), (17,), (127,), (4097,), (3, 5, 7), (2, 0, 3), (1000003,), (65, 129)]


def rand(shape, dtype, device, scale_spread=True):
    """Random values over many magnitudes (exercises rounding), never zeros."""
    x = torch.randn(shape, dtype=torch.float64, device=device)
    if scale_spread and x.numel():
        x = x * torch.exp2(torch.randint(-8, 9, shape, device=device).to(torch.float64))
    return x.to(dtype)


def check_exact(a, b):
    """The op must equal the correctly rounded sum bit for bit (see reference.vector_add)."""
    poison_cuda_allocator(a.numel() * a.element_size(), str(a.device))
    out = opforge.vector_add(a, b)
    assert out.shape == a.shape and out.dtype == a.dtype and out.device == a.device
    assert_close(out, reference.vector_add(a, b), rtol=0, atol=0)
    assert_close(out, torch.add(a, b), rtol=0, atol=0)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference(device, dtype, shape):
    check_exact(rand(shape, dtype, device), rand(shape, dtype, device))


@pytest.mark.parametrize("device", DEVICES)
def test_special_values(device):
    vals = torch.tensor(
        [float("inf"), -float("inf"), float("nan"), -0.0, 0.0, 65504.0, 1e-40, 3.0], device=device
    )
    a = vals.repeat_interleave(len(vals))
    b = vals.repeat(len(vals))
    for dtype in DTYPES:
        out = opforge.vector_add(a.to(dtype), b.to(dtype))
        want = torch.add(a.to(dtype), b.to(dtype))
        assert_close(out, want, rtol=0, atol=0, equal_nan=True)
        # Signed zeros (-0 + -0 = -0) match too; a NaN's sign means nothing, so skip those.
        num = ~want.isnan()
        assert torch.equal(torch.signbit(out[num]), torch.signbit(want[num]))


def _layouts(device):
    """(name, a, b) pairs of non-contiguous, mixed and unaligned layouts."""
    base = rand((64, 96), torch.float32, device)
    other = rand((64, 96), torch.float32, device)
    img = rand((2, 3, 17, 19), torch.float32, device)
    yield "transposed both", base.t(), other.t()
    yield "transposed one", base.t(), rand((96, 64), torch.float32, device)
    yield "sliced step", rand((64, 200), torch.float32, device)[:, ::3], rand((64, 67), torch.float32, device)
    yield "expanded", rand((1, 96), torch.float32, device).expand(64, 96), other
    yield (
        "scalar expanded",
        rand((), torch.float32, device).expand(33, 5),
        rand((33, 5), torch.float32, device),
    )
    yield (
        "channels_last both",
        img.to(memory_format=torch.channels_last),
        rand((2, 3, 17, 19), torch.float32, device).to(memory_format=torch.channels_last),
    )
    yield (
        "channels_last one",
        img.to(memory_format=torch.channels_last),
        rand((2, 3, 17, 19), torch.float32, device),
    )
    yield (
        "unaligned offset",
        rand((4099,), torch.float32, device)[1:],
        rand((4101,), torch.float32, device)[3:],
    )
    yield (
        "permuted 5d",
        rand((3, 4, 5, 6, 7), torch.float16, device).permute(4, 2, 0, 3, 1),
        rand((7, 5, 3, 6, 4), torch.float16, device),
    )
    yield (
        "size-1 dims",
        rand((1, 50, 1, 3), torch.bfloat16, device),
        rand((1, 50, 1, 3), torch.bfloat16, device),
    )
    # 10 dims that no stride pattern can merge: the copy fallback beyond kMaxDims.
    nine = rand((2,) * 10, torch.float32, device).permute(9, 0, 8, 1, 7, 2, 6, 3, 5, 4)
    yield "10 unmergeable dims", nine, rand((2,) * 10, torch.float32, device)


@pytest.mark.parametrize("device", DEVICES)
def test_layouts(device):
    for name, a, b in _layouts(device):
        out = check_exact(a, b)
        if (
            a.is_contiguous()
            or a.is_contiguous(memory_format=torch.channels_last)
            or name.startswith("transposed")
        ):
            # Dense a: the output keeps a's layout, like torch.empty_like.
            assert out.stride() == torch.empty_like(a).stride(), name


@pytest.mark.parametrize("device", DEVICES)
def test_inputs_unchanged_and_fresh_output(device):
    a, b = rand((1000,), torch.float32, device), rand((1000,), torch.float32, device)
    a0, b0 = a.clone(), b.clone()
    out = opforge.vector_add(a, b)
    assert torch.equal(a, a0) and torch.equal(b, b0)
    assert out.data_ptr() not in (a.data_ptr(), b.data_ptr())
    same = opforge.vector_add(a, a)  # aliasing inputs is fine
    assert_close(same, a * 2, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_autograd(device):
    a = rand((5, 7), torch.float32, device).requires_grad_()
    b = rand((5, 7), torch.float32, device).requires_grad_()
    out = opforge.vector_add(a, b)
    grad = torch.randn_like(out)
    out.backward(grad)
    assert_close(a.grad, grad, rtol=0, atol=0)
    assert_close(b.grad, grad, rtol=0, atol=0)
    # Only one input requiring grad.
    c = rand((5, 7), torch.float32, device).requires_grad_()
    opforge.vector_add(c, b.detach()).sum().backward()
    assert_close(c.grad, torch.ones_like(c), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    a = torch.randn(4, 6, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(4, 6, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(opforge.vector_add, (a, b))
    assert torch.autograd.gradgradcheck(opforge.vector_add, (a, b))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    samples = [
        (rand((3, 5), torch.float32, device), rand((3, 5), torch.float32, device)),
        (
            rand((4, 6), torch.float64, device).requires_grad_(),
            rand((4, 6), torch.float64, device).requires_grad_(),
        ),
        (rand((8, 3), torch.float16, device).t(), rand((3, 8), torch.float16, device)),
        (rand((0, 4), torch.bfloat16, device), rand((0, 4), torch.bfloat16, device)),
    ]
    for a, b in samples:
        torch.library.opcheck(torch.ops.opforge.vector_add.default, (a, b))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def f(a, b):
        return opforge.vector_add(a, b) * 2 + 1

    a, b = rand((33, 9), torch.float32, device), rand((33, 9), torch.float32, device)
    assert_close(f(a, b), (a + b) * 2 + 1)
    # Training through the compiled graph.
    a.requires_grad_()
    f(a, b).sum().backward()
    assert_close(a.grad, torch.full_like(a, 2.0))


def test_meta_tensors():
    a = torch.empty(3, 4, device="meta").t()
    out = opforge.vector_add(a, torch.empty(4, 3, device="meta"))
    assert out.shape == (4, 3) and out.device.type == "meta" and out.stride() == a.stride()


# --- errors: each message names the op and the argument ------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_error_shape(device):
    with pytest.raises(
        RuntimeError, match=r"opforge\.vector_add: b must have the same shape as a \[3, 4\], got \[4, 3\]"
    ):
        opforge.vector_add(torch.ones(3, 4, device=device), torch.ones(4, 3, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_error_dtype_mismatch(device):
    with pytest.raises(
        RuntimeError, match=r"opforge\.vector_add: b must have the same dtype as a \(float32\), got float16"
    ):
        opforge.vector_add(torch.ones(3, device=device), torch.ones(3, device=device, dtype=torch.float16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_error_unsupported_dtype(device, dtype):
    a = torch.ones(3, device=device, dtype=dtype)
    with pytest.raises(
        RuntimeError,
        match=r"opforge\.vector_add: a must be one of \(float32, float64, float16, bfloat16\), got",
    ):
        opforge.vector_add(a, a)


def test_error_device_mismatch_meta():
    with pytest.raises(
        RuntimeError, match=r"opforge\.vector_add: b must be on the same device as a \(cpu\), got meta"
    ):
        opforge.vector_add(torch.ones(3), torch.ones(3, device="meta"))


@pytest.mark.cuda
def test_error_device_mismatch_cuda():
    with pytest.raises(
        RuntimeError, match=r"opforge\.vector_add: b must be on the same device as a \(cuda:0\), got cpu"
    ):
        opforge.vector_add(torch.ones(3, device="cuda"), torch.ones(3))
    with pytest.raises(
        RuntimeError, match=r"opforge\.vector_add: b must be on the same device as a \(cpu\), got cuda:0"
    ):
        opforge.vector_add(torch.ones(3), torch.ones(3, device="cuda"))


@pytest.mark.parametrize("bad", [None, 3.0, [1.0, 2.0], "x"])
def test_error_not_a_tensor(bad):
    with pytest.raises(TypeError, match=r"opforge\.vector_add: b must be a torch\.Tensor, got"):
        opforge.vector_add(torch.ones(2), bad)
    with pytest.raises(TypeError, match=r"opforge\.vector_add: a must be a torch\.Tensor, got"):
        opforge.vector_add(bad, torch.ones(2))


def test_one_exception_type_per_condition():
    """The wrapper, the raw op and its fake kernel (FakeTensorMode, meta tensors) raise the same
    type with the same words. vector_add takes no argument but its two tensors, so every condition
    is one of tensors that do not fit: RuntimeError (a shape and a dtype condition here)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cases = [
        (
            (torch.ones(3, 4), torch.ones(4, 3)),
            r"opforge\.vector_add: b must have the same shape as a \[3, 4\]",
        ),
        ((torch.ones(3), torch.ones(3, dtype=torch.float16)), r"b must have the same dtype as a \(float32\)"),
        ((torch.ones(3, dtype=torch.int64),) * 2, r"opforge\.vector_add: a must be one of \(float32"),
    ]
    raw = torch.ops.opforge.vector_add.default
    for (a, b), msg in cases:
        with pytest.raises(RuntimeError, match=msg) as wrapper:
            opforge.vector_add(a, b)
        with pytest.raises(RuntimeError) as real:
            raw(a, b)
        with FakeTensorMode() as mode, pytest.raises(RuntimeError) as fake:
            raw(mode.from_tensor(a), mode.from_tensor(b))
        with pytest.raises(RuntimeError) as meta:
            raw(a.to("meta"), b.to("meta"))
        assert str(wrapper.value) == str(real.value) == str(fake.value) == str(meta.value)


def test_error_compile_same_words():
    torch._dynamo.reset()
    f = torch.compile(opforge.vector_add, fullgraph=True)
    with pytest.raises(Exception, match=r"opforge\.vector_add: b must have the same shape as a"):
        f(torch.ones(3), torch.ones(4))


# --- CUDA: streams, graphs, CPU agreement, > 2^31 elements ---------------------------------


@pytest.mark.cuda
def test_cuda_matches_cpu():
    for dtype in DTYPES:
        a, b = rand((3001,), dtype, "cpu"), rand((3001,), dtype, "cpu")
        assert_close(opforge.vector_add(a.cuda(), b.cuda()).cpu(), opforge.vector_add(a, b), rtol=0, atol=0)


@pytest.mark.cuda
def test_cuda_non_default_stream():
    """The kernel runs on the current stream: it must see work queued before it on that stream."""
    n = 1 << 22
    a = torch.empty(n, device="cuda")
    b = torch.ones(n, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # keep the stream busy so a wrong-stream launch would race
        a.fill_(2.0)
        out = opforge.vector_add(a, b)
    s.synchronize()
    assert torch.equal(out, torch.full_like(out, 3.0))


@pytest.mark.cuda
def test_cuda_graph_capture():
    a = torch.randn(10_000, device="cuda")
    b = torch.randn(10_000, device="cuda")
    opforge.vector_add(a, b)  # warm up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = opforge.vector_add(a, b)
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, a + b)


@pytest.mark.cuda
def test_cuda_other_device_guard():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    a = torch.randn(100, device="cuda:1")
    assert torch.equal(opforge.vector_add(a, a), a + a)


@pytest.mark.large
@pytest.mark.parametrize("device", DEVICES)
def test_more_than_2_31_elements(device):
    """int64 indexing: values past element 2^31 are right, flat and strided paths."""
    n = (1 << 31) + 37
    a = torch.arange(2048, dtype=torch.float16, device=device).repeat(n // 2048 + 1)[
        :n
    ]  # 4 GiB, exact values
    b = torch.ones((), dtype=torch.float16, device=device).expand(n)  # stride 0: strided path
    out = opforge.vector_add(a, b)
    tail = slice(n - 4096, n)
    assert_close(out[tail], a[tail] + 1, rtol=0, atol=0)
    del out
    out = opforge.vector_add(a, a)  # flat path
    assert_close(out[tail], a[tail] * 2, rtol=0, atol=0)
    assert_close(out[:4096], a[:4096] * 2, rtol=0, atol=0)


# --- edges: layouts the fake kernel must agree on, non-tensors and other layouts, torch.func ---


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", [9, 12])
def test_many_dims_real_matches_fake(device, dims):
    """Dense inputs whose dims do not collapse (a permuted against b contiguous): the output keeps
    a's layout as the fake kernel promises (torch.compile and opcheck compare the two)."""
    # 9 dims reversed against b's order: nothing merges (the case); 12: a random order.
    perm = list(reversed(range(dims))) if dims == 9 else torch.randperm(dims).tolist()
    while perm == sorted(perm):
        perm = torch.randperm(dims).tolist()
    a = rand([2] * dims, torch.float32, device).permute(*perm)
    b = rand(a.shape, torch.float32, device)
    out = check_exact(a, b)
    assert out.stride() == torch.empty_like(a).stride()
    torch.library.opcheck(torch.ops.opforge.vector_add.default, (a, b))
    torch.library.opcheck(torch.ops.opforge.vector_add.default, (a, a.permute(*reversed(range(dims)))))


@pytest.mark.parametrize("device", DEVICES)
def test_more_than_64_dims(device):
    """70 dims (torch's own elementwise ops stop at 64): the op still adds them, in a's layout."""
    shape = [1] * 30 + [3, 1, 2] + [1] * 37
    a = rand(shape, torch.float32, device)
    b = rand(shape, torch.float32, device).transpose(30, 32).contiguous().transpose(30, 32)
    assert not b.is_contiguous()
    poison_cuda_allocator(4 * a.numel(), device)
    out = opforge.vector_add(a, b)
    assert out.dim() == 70 and out.shape == a.shape and out.stride() == torch.empty_like(a).stride()
    want = (a.squeeze().double() + b.squeeze().double()).float()  # 2-D: within torch's limits
    assert torch.equal(out.squeeze(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_error_none_through_the_dispatcher(device):
    x = torch.ones(3, device=device)
    with pytest.raises(RuntimeError, match=r"opforge\.vector_add: b must be a tensor, got None"):
        torch.ops.opforge.vector_add(x, None)
    with pytest.raises(RuntimeError, match=r"opforge\.vector_add: a must be a tensor, got None"):
        torch.ops.opforge.vector_add(None, x)


@pytest.mark.parametrize("device", DEVICES)
def test_error_nested_and_sparse(device):
    x = torch.ones(2, 3, device=device)
    nested = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)], device=device)
    with pytest.raises(
        RuntimeError, match=r"opforge\.vector_add: a must be a dense \(strided\) tensor, got a nested"
    ):
        opforge.vector_add(nested, nested)
    with pytest.raises(
        RuntimeError, match=r"opforge\.vector_add: b must be a dense \(strided\) tensor, got a nested"
    ):
        opforge.vector_add(x, nested)
    with pytest.raises(
        RuntimeError,
        match=r"opforge\.vector_add: a must be a dense \(strided\) tensor, got a tensor of layout Sparse",
    ):
        opforge.vector_add(x.to_sparse(), x.to_sparse())
    with pytest.raises(
        RuntimeError,
        match=r"opforge\.vector_add: b must be a dense \(strided\) tensor, got a tensor of layout SparseCsr",
    ):
        opforge.vector_add(x, x.to_sparse_csr())


def test_torch_func_transforms():
    """grad, vjp, jacrev, jacfwd, jvp, vmap, hessian and forward-mode AD through opforge.vector_add
    (the op's C++ autograd kernel cannot serve torch.func: the wrapper takes a Python Function)."""
    import torch.autograd.forward_ad as fwad

    a, b = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    w = torch.randn(4, 5, dtype=torch.float64)
    assert_close(torch.func.grad(lambda x: (opforge.vector_add(x, b) * w).sum())(a), w, rtol=0, atol=0)
    _, pull = torch.func.vjp(opforge.vector_add, a, b)
    da, db = pull(w)
    assert_close(da, w, rtol=0, atol=0)
    assert_close(db, w, rtol=0, atol=0)
    want = torch.func.jacrev(lambda x: x + b * x)(a)
    assert_close(torch.func.jacrev(lambda x: opforge.vector_add(x, b * x))(a), want)
    assert_close(torch.func.jacfwd(lambda x: opforge.vector_add(x, b * x))(a), want)
    t = torch.randn_like(a)
    _, tangent = torch.func.jvp(lambda x: opforge.vector_add(x, x * x), (a,), (t,))
    assert_close(tangent, t + 2 * a * t)
    xs, ys = torch.randn(3, 4, 5), torch.randn(3, 4, 5)
    assert_close(torch.func.vmap(opforge.vector_add)(xs, ys), xs + ys, rtol=0, atol=0)
    assert_close(
        torch.func.vmap(opforge.vector_add, in_dims=(1, None))(xs, ys[:, 0]), xs.movedim(1, 0) + ys[:, 0]
    )
    h = torch.func.hessian(lambda x: (opforge.vector_add(x, x) ** 3).sum())(a[0])
    assert_close(h, torch.diag(48 * a[0]))
    with fwad.dual_level():
        out = opforge.vector_add(fwad.make_dual(a, t), b)
        assert_close(fwad.unpack_dual(out).tangent, t, rtol=0, atol=0)
