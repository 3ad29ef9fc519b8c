"""opforge.copy_async / opforge.to_device_async: results, layouts, errors, compile, and on CUDA the
transfer kinds, streams, asynchrony, graph capture and the allocators' stream bookkeeping."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest
import torch

import opforge

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool]


def rand(shape, dtype=torch.float32, device="cpu"):
    if dtype == torch.bool:
        return torch.rand(shape, device=device) < 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, device=device).to(dtype)
    return torch.randint(0, 100, shape, device=device).to(dtype)


def poisoned(shape, dtype=torch.float32, device="cpu", pin=False):
    """A destination filled with what rand() never writes (NaN, -1, 255; True for bool), so an
    element the copy misses shows."""
    fill = {torch.uint8: 255, torch.bool: True, torch.int64: -1}.get(dtype, float("nan"))
    t = torch.full(shape, fill, dtype=dtype, device=device)
    return t.pin_memory() if pin else t


def check_copy(dst, src):
    out = opforge.copy_async(dst, src)
    assert out is dst
    if dst.is_cuda or src.is_cuda:
        torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), src.cpu())


# --- CPU -> CPU -----------------------------------------------------------------------------


def _cpu_pairs(dtype):
    """(name, dst, src): the layouts a host copy meets."""
    yield "contiguous", poisoned((37, 53), dtype), rand((37, 53), dtype)
    yield "large (parallel memcpy)", poisoned((3 << 20,), dtype), rand((3 << 20,), dtype)
    yield "transposed dst", poisoned((53, 37), dtype).t(), rand((37, 53), dtype)
    yield "both transposed (dense)", poisoned((53, 37), dtype).t(), rand((53, 37), dtype).t()
    yield "non-contiguous src", poisoned((20, 30), dtype), rand((40, 100), dtype)[::2, 5:95:3]
    yield "expanded src", poisoned((6, 40), dtype), rand((1, 40), dtype).expand(6, 40)
    yield (
        "channels_last dst",
        poisoned((2, 3, 5, 7), dtype).to(memory_format=torch.channels_last),
        rand((2, 3, 5, 7), dtype),
    )
    yield "storage offset", poisoned((100,), dtype)[3:83], rand((90,), dtype)[7:87]
    yield "0-d", poisoned((), dtype), rand((), dtype)
    yield "empty", poisoned((0, 4), dtype), rand((0, 4), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cpu_to_cpu(dtype):
    for name, dst, src in _cpu_pairs(dtype):
        src0, strides = src.clone(), dst.stride()
        check_copy(dst, src)
        assert torch.equal(src, src0) and dst.stride() == strides, name


@pytest.mark.parametrize("dst_off,src_off", [(0, 0), (1, 0), (0, 7), (13, 5), (63, 64)])
@pytest.mark.parametrize("threads", [1, 4])
def test_cpu_large_unaligned(dst_off, src_off, threads):
    """A parallel host copy: any alignment, a ragged tail, bytes just outside the destination
    untouched, whether one thread or several split the copy."""
    n = (4 << 20) + 4097
    dst_buf = torch.full((n + 128,), 255, dtype=torch.uint8)
    src = torch.randint(0, 255, (n + 128,), dtype=torch.uint8)[src_off : src_off + n]  # never 255
    dst = dst_buf[dst_off : dst_off + n]
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        check_copy(dst, src)
    finally:
        torch.set_num_threads(old)
    assert (dst_buf[:dst_off] == 255).all() and (dst_buf[dst_off + n :] == 255).all()


def _child_copy() -> bool:
    # numpy for the data: torch's own OpenMP regions can hang in a forked child (libgomp is not
    # fork-safe), which is not what this tests.
    torch.set_num_threads(2)  # a forked child may start with one intra-op thread
    src = np.random.default_rng().integers(0, 255, 8 << 20, dtype=np.uint8)
    dst = np.full_like(src, 255)
    opforge.copy_async(torch.from_numpy(dst), torch.from_numpy(src))
    return bool((dst == src).all())


def test_cpu_copy_in_forked_child():
    """The host copy pool's threads do not survive fork(): a child process copies with its own."""
    src = torch.randint(0, 255, (8 << 20,), dtype=torch.uint8)
    check_copy(torch.empty_like(src), src)  # the parent's pool is running
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply_async(_child_copy).get(timeout=120) is True


def test_cpu_copies_from_several_threads():
    """Large host copies started from several threads at once (one pool, jobs in turn) all land."""
    pairs = [
        (torch.full((5 << 20,), 255, dtype=torch.uint8), torch.randint(0, 255, (5 << 20,), dtype=torch.uint8))
    ]
    pairs += [
        (torch.full_like(s, 255), torch.randint(0, 255, s.shape, dtype=torch.uint8)) for _, s in pairs * 5
    ]
    errors = []

    def work(dst, src):
        try:
            for _ in range(5):
                dst.fill_(255)
                opforge.copy_async(dst, src)
                assert torch.equal(dst, src)
        except BaseException as e:  # surfaces below
            errors.append(e)

    threads = [threading.Thread(target=work, args=pair) for pair in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)


def test_cpu_same_memory():
    buf = torch.randn(10)
    want = buf.clone()
    assert opforge.copy_async(buf, buf) is buf and torch.equal(buf, want)  # the same tensor
    check_copy(buf[2:7], buf[2:7])  # another view of the same elements
    even, odd = buf[0::2], buf[1::2]  # interleaved, not overlapping
    check_copy(even, odd)
    assert torch.equal(buf[0::2], want[1::2]) and torch.equal(buf[1::2], want[1::2])


def test_error_dtype():
    with pytest.raises(
        RuntimeError,
        match=r"opforge\.copy_async: src must have the same dtype as dst \(float32\), got float16",
    ):
        opforge.copy_async(torch.empty(3), torch.ones(3, dtype=torch.float16))


def test_error_shape():
    with pytest.raises(
        RuntimeError, match=r"opforge\.copy_async: src must have the same shape as dst \[3, 4\], got \[4, 3\]"
    ):
        opforge.copy_async(torch.empty(3, 4), torch.ones(4, 3))
    with pytest.raises(
        RuntimeError, match=r"opforge\.copy_async: src must have the same shape as dst \[12\]"
    ):
        opforge.copy_async(torch.empty(12), torch.ones(3, 4))


def test_error_expanded_dst():
    dst = torch.zeros(1, 5).expand(4, 5)
    with pytest.raises(RuntimeError, match=r"opforge\.copy_async: dst has elements that share memory"):
        opforge.copy_async(dst, torch.randn(4, 5))
    assert (dst == 0).all()


def test_error_partial_overlap():
    buf = torch.arange(20.0)
    with pytest.raises(RuntimeError, match=r"opforge\.copy_async: dst and src partially overlap in memory"):
        opforge.copy_async(buf[1:11], buf[0:10])
    with pytest.raises(RuntimeError, match=r"opforge\.copy_async: dst and src partially overlap in memory"):
        opforge.copy_async(buf[:16].view(4, 4), buf[:16].view(4, 4).t())  # an in-place transpose
    assert torch.equal(buf, torch.arange(20.0))


def test_overlap_errors_are_copy_s():
    """Memory overlap raises RuntimeError, as Tensor.copy_ raises for the same tensors."""
    buf = torch.arange(20.0)
    for dst, src in ((torch.zeros(1, 5).expand(4, 5), torch.randn(4, 5)), (buf[1:11], buf[0:10])):
        with pytest.raises(RuntimeError, match=r"unsupported operation"):
            dst.copy_(src)
        with pytest.raises(RuntimeError, match=r"opforge\.copy_async: "):
            opforge.copy_async(dst, src)


def test_one_exception_type_per_condition():
    """The wrapper, the raw op and its fake kernel (FakeTensorMode, meta tensors) raise the same
    type with the same words. copy_async takes no argument but its two tensors, so every condition
    is one of tensors that do not fit: RuntimeError (a shape, a dtype and a memory condition)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cases = [
        (
            (torch.empty(3, 4), torch.ones(4, 3)),
            r"src must have the same shape as dst \[3, 4\], got \[4, 3\]",
        ),
        ((torch.empty(3), torch.ones(3, dtype=torch.float16)), r"src must have the same dtype as dst"),
        ((torch.zeros(1, 5).expand(4, 5), torch.randn(4, 5)), r"dst has elements that share memory"),
    ]
    raw = torch.ops.opforge.copy_async.default
    for (dst, src), msg in cases:
        with pytest.raises(RuntimeError, match=r"opforge\.copy_async: " + msg) as wrapper:
            opforge.copy_async(dst, src)
        with pytest.raises(RuntimeError) as real:
            raw(dst, src)
        with FakeTensorMode() as mode, pytest.raises(RuntimeError) as fake:
            raw(mode.from_tensor(dst), mode.from_tensor(src))
        meta_dst = torch.empty_strided(dst.shape, dst.stride(), dtype=dst.dtype, device="meta")
        with pytest.raises(RuntimeError) as meta:
            raw(meta_dst, src.to("meta"))
        assert str(wrapper.value) == str(real.value) == str(fake.value) == str(meta.value)


@pytest.mark.parametrize("bad", [None, 3.0, [1.0, 2.0], "x"])
def test_error_not_a_tensor(bad):
    with pytest.raises(TypeError, match=r"opforge\.copy_async: src must be a torch\.Tensor, got"):
        opforge.copy_async(torch.ones(2), bad)
    with pytest.raises(TypeError, match=r"opforge\.copy_async: dst must be a torch\.Tensor, got"):
        opforge.copy_async(bad, torch.ones(2))
    with pytest.raises(TypeError, match=r"opforge\.to_device_async: src must be a torch\.Tensor, got"):
        opforge.to_device_async(bad, "cpu")


def test_error_none_through_the_dispatcher():
    with pytest.raises(RuntimeError, match=r"opforge\.copy_async: src must be a tensor, got None"):
        torch.ops.opforge.copy_async(torch.ones(3), None)


def test_error_meta_source():
    """A meta src has no data: refused as Tensor.copy_ refuses it (NotImplementedError), through
    every entry (the call dispatches to the op's meta kernel, which once returned without writing
    dst), and dst is left as it was."""
    meta = torch.ones(3, device="meta")
    with pytest.raises(NotImplementedError):
        torch.full((3,), 7.0).copy_(meta)
    dst = torch.full((3,), 7.0)
    want = r"opforge\.copy_async: src is a meta tensor, it has no data to copy into dst \(on cpu\)"
    with pytest.raises(NotImplementedError, match=want):
        opforge.copy_async(dst, meta)
    with pytest.raises(NotImplementedError, match=want):
        torch.ops.opforge.copy_async(dst, meta)
    assert torch.equal(dst, torch.full((3,), 7.0))
    with pytest.raises(
        NotImplementedError,
        match=r"opforge\.to_device_async: src is a meta tensor, it has no data to copy to cpu",
    ):
        opforge.to_device_async(meta, "cpu")
    with pytest.raises(NotImplementedError, match=want):
        torch.ops.opforge.to_device_async(meta, torch.device("cpu"))


def test_meta_destination_as_copy_():
    """A meta dst holds no data, so a copy into it has nothing to write: allowed, as Tensor.copy_
    and Tensor.to("meta") allow it (and the shape and dtype checks still apply)."""
    for src in (torch.randn(4, 5), torch.empty(4, 5, device="meta")):
        dst = torch.empty(4, 5, device="meta")
        assert opforge.copy_async(dst, src) is dst
        out = opforge.to_device_async(src, "meta")
        assert out.device.type == "meta" and out.shape == (4, 5) and out.dtype == src.dtype
    with pytest.raises(RuntimeError, match=r"opforge\.copy_async: src must have the same shape as dst"):
        opforge.copy_async(torch.empty(4, 5, device="meta"), torch.randn(5, 4))


def test_error_meta_source_compile_same_words():
    torch._dynamo.reset()
    f = torch.compile(opforge.copy_async, fullgraph=True)
    with pytest.raises(Exception, match=r"opforge\.copy_async: src is a meta tensor, it has no data"):
        f(torch.zeros(3), torch.ones(3, device="meta"))


# --- compile, opcheck, to_device_async on the CPU ------------------------------------------------


def test_torch_compile_fullgraph():
    torch._dynamo.reset()

    @torch.compile(fullgraph=True)
    def f(buf, x):
        opforge.copy_async(buf, x)
        return buf * 2

    buf, x = torch.zeros(33, 9), torch.randn(33, 9)
    out = f(buf, x)
    assert torch.equal(out, x * 2)
    assert torch.equal(buf, x)  # the mutation of the input is kept
    x2 = torch.randn(33, 9)
    assert torch.equal(f(buf, x2), x2 * 2) and torch.equal(buf, x2)


def test_error_compile_same_words():
    torch._dynamo.reset()
    f = torch.compile(opforge.copy_async, fullgraph=True)
    with pytest.raises(Exception, match=r"opforge\.copy_async: src must have the same shape as dst"):
        f(torch.zeros(3), torch.ones(4))


def test_autograd_sees_the_write():
    """As Tensor.copy_: the destination's version counter moves, so a backward that saved its old
    values raises instead of computing a gradient from the new ones."""
    x = torch.randn(4, requires_grad=True)
    a = x * 2
    b = a.sin()  # saves a
    version = a._version
    opforge.copy_async(a, torch.zeros(4))
    assert a._version > version and torch.equal(a, torch.zeros(4))
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation"):
        b.sum().backward()


def test_autograd_refuses_a_leaf_that_requires_grad():
    w = torch.randn(4, requires_grad=True)
    with pytest.raises(
        RuntimeError, match=r"a leaf Variable that requires grad is being used in an in-place"
    ):
        opforge.copy_async(w, torch.zeros(4))
    with torch.no_grad():  # as with copy_: allowed outside autograd
        opforge.copy_async(w, torch.ones(4))
    assert torch.equal(w.detach(), torch.ones(4))


def test_autograd_gradient_as_copy_():
    """The gradient flows as through Tensor.copy_: to src, none to dst's old values."""
    x = torch.randn(4, requires_grad=True)
    src = torch.randn(4, requires_grad=True)
    for copy in (opforge.copy_async, torch.Tensor.copy_):
        x.grad = src.grad = None
        dst = x * 2
        copy(dst, src * 5)
        assert torch.equal(dst, (src * 5).detach())
        (dst * 3).sum().backward()
        assert torch.equal(src.grad, torch.full((4,), 15.0))
        assert x.grad is None or (x.grad == 0).all()
    # into a view: the base's other elements keep their history
    x.grad = src.grad = None
    base = x * 1
    opforge.copy_async(base[1:3], src[:2])
    base.sum().backward()
    assert torch.equal(x.grad, torch.tensor([1.0, 0.0, 0.0, 1.0])) and torch.equal(
        src.grad[:2], torch.ones(2)
    )


def test_opcheck():
    samples = [
        (torch.empty(3, 5), torch.randn(3, 5)),
        (torch.empty(6, 4).t(), torch.randn(4, 6)),
        (torch.empty(4, 6, dtype=torch.float16), torch.randn(8, 12).half()[::2, ::2]),
        (torch.empty(0, 3, dtype=torch.int64), torch.empty(0, 3, dtype=torch.int64)),
    ]
    for dst, src in samples:
        torch.library.opcheck(torch.ops.opforge.copy_async.default, (dst, src))


@pytest.mark.parametrize(
    "make, dense",
    [
        (lambda: torch.randn(7, 5).t(), True),
        (lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last), True),
        (lambda: torch.randn(3, 4, 5).permute(2, 0, 1), True),
        (lambda: torch.randn(9, 4), True),
        (lambda: torch.randn(10, 8)[::2, 1:], False),
    ],
    ids=["transposed", "channels_last", "permuted", "contiguous", "sliced"],
)
def test_to_device_async_cpu(make, dense):
    src = make()
    out = opforge.to_device_async(src, "cpu")
    assert out.device.type == "cpu" and out.data_ptr() != src.data_ptr()
    assert torch.equal(out, src)
    if dense:  # src's layout kept
        assert out.stride() == src.stride()
    out2 = opforge.to_device_async(src, torch.device("cpu"))
    assert torch.equal(out2, src) and out2.data_ptr() not in (src.data_ptr(), out.data_ptr())


# --- CUDA ------------------------------------------------------------------------------------

MB64 = 16 << 20  # float32 elements in 64 MiB


def _h2d_pairs():
    src = rand((123, 457))
    yield "same layout", poisoned((123, 457), device="cuda"), src
    yield "transposed dst", poisoned((457, 123), device="cuda").t(), src
    yield "both transposed", poisoned((457, 123), device="cuda").t(), rand((457, 123)).t()
    yield "sliced src", poisoned((60, 100), device="cuda"), rand((120, 300))[::2, 7:107]
    yield "large", poisoned((MB64 // 4,), device="cuda"), rand((MB64 // 4,))
    yield "uint8", poisoned((1000, 3), torch.uint8, device="cuda"), rand((1000, 3), torch.uint8)
    yield (
        "half, offset",
        poisoned((300,), torch.float16, device="cuda")[1:],
        rand((400,), torch.float16)[5:304],
    )


@pytest.mark.cuda
@pytest.mark.parametrize("pin", [True, False], ids=["pinned", "pageable"])
def test_cuda_host_to_device(pin):
    for name, dst, src in _h2d_pairs():
        if pin:
            base = src._base if src._base is not None else src
            pinned = base.pin_memory()
            src = pinned.as_strided(src.shape, src.stride(), src.storage_offset())
            assert src.is_pinned()
        src0 = src.clone()
        check_copy(dst, src)
        assert torch.equal(src, src0), name


@pytest.mark.cuda
def test_cuda_device_to_device():
    pairs = [
        ("same layout", poisoned((300, 211), device="cuda"), rand((300, 211), device="cuda")),
        ("transposed dst", poisoned((211, 300), device="cuda").t(), rand((300, 211), device="cuda")),
        ("both transposed", poisoned((211, 300), device="cuda").t(), rand((211, 300), device="cuda").t()),
        ("sliced src", poisoned((50, 70), device="cuda"), rand((100, 300), device="cuda")[::2, 3:73]),
        (
            "channels_last dst",
            poisoned((2, 3, 17, 19), torch.bfloat16, device="cuda").to(memory_format=torch.channels_last),
            rand((2, 3, 17, 19), torch.bfloat16, device="cuda"),
        ),
        ("large", poisoned((MB64,), device="cuda"), rand((MB64,), device="cuda")),
    ]
    for name, dst, src in pairs:
        check_copy(dst, src)
        assert dst.is_cuda, name


@pytest.mark.cuda
@pytest.mark.parametrize("pin", [True, False], ids=["pinned", "pageable"])
def test_cuda_device_to_host(pin):
    pairs = [
        ("same layout", poisoned((300, 211), pin=pin), rand((300, 211), device="cuda")),
        ("transposed dst", poisoned((211, 300), pin=pin).t(), rand((300, 211), device="cuda")),
        ("sliced src", poisoned((50, 70), pin=pin), rand((100, 300), device="cuda")[::2, 3:73]),
        ("large", poisoned((MB64,), pin=pin), rand((MB64,), device="cuda")),
        ("uint8", poisoned((999,), torch.uint8, pin=pin), rand((999,), torch.uint8, device="cuda")),
    ]
    if not pin:
        pairs.append(("non-dense dst", poisoned((40, 60))[:, ::3], rand((40, 20), device="cuda")))
    for name, dst, src in pairs:
        check_copy(dst, src)
        assert dst.device.type == "cpu" and dst.is_pinned() == pin, name


@pytest.mark.cuda
def test_cuda_non_default_stream():
    """The copies go on the current stream: they wait for the work queued before them there, and
    a later kernel there sees them."""
    n = 1 << 22
    want = rand((n,))
    pinned = want.pin_memory()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dst = torch.empty(n, device="cuda")  # allocated on the side stream
        torch.cuda._sleep(50_000_000)  # a copy on another stream would run before the fill
        dst.fill_(-1.0)
        opforge.copy_async(dst, pinned)  # H2D after the fill
        dev = torch.empty(n, device="cuda")
        opforge.copy_async(dev, dst)  # D2D
        dev.add_(1.0)
        back = torch.empty(n, pin_memory=True)
        opforge.copy_async(back, dev)  # D2H after the add
    s.synchronize()
    assert torch.equal(dst.cpu(), want)
    assert torch.equal(back, want + 1.0)


@pytest.mark.cuda
def test_cuda_pinned_copy_is_asynchronous():
    src = rand((MB64,)).pin_memory()  # 64 MiB
    dst = torch.zeros(MB64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(int(5e8))  # the GPU busy for a good fraction of a second
    opforge.copy_async(dst, src)
    assert not torch.cuda.current_stream().query(), "copy_async waited for the stream"
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), src)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["d2d", "d2d transposed", "pinned h2d", "pinned d2h"])
def test_cuda_graph_capture(kind):
    shape = (64, 96)
    if kind == "d2d":
        src, dst = rand(shape, device="cuda"), torch.empty(shape, device="cuda")
    elif kind == "d2d transposed":
        src, dst = rand(shape, device="cuda"), torch.empty(shape[::-1], device="cuda").t()
    elif kind == "pinned h2d":
        src, dst = rand(shape).pin_memory(), torch.empty(shape, device="cuda")
    else:
        src, dst = rand(shape, device="cuda"), torch.empty(shape, pin_memory=True)
    opforge.copy_async(dst, src)  # warm up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        opforge.copy_async(dst, src)
    for _ in range(3):
        torch.cuda.synchronize()
        src.copy_(rand(shape))  # new contents, same memory
        dst.fill_(float("nan"))
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(dst.cpu(), src.cpu())


@pytest.mark.cuda
def test_cuda_graph_capture_pageable_raises():
    src, dst = torch.randn(1000), torch.empty(1000, device="cuda")
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"opforge\.copy_async: src is in pageable host memory"):
        with torch.cuda.graph(g):
            opforge.copy_async(dst, src)
    g2 = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"opforge\.copy_async: dst is in pageable host memory"):
        with torch.cuda.graph(g2):
            opforge.copy_async(torch.empty(1000), dst)
    torch.cuda.synchronize()
    check_copy(dst, src)  # outside a capture: fine


@pytest.mark.cuda
def test_cuda_to_device_async():
    src = rand((7, 5)).pin_memory().t()  # pinned, dense, transposed
    out = opforge.to_device_async(src, "cuda")
    torch.cuda.synchronize()
    assert out.is_cuda and out.stride() == src.stride() and torch.equal(out.cpu(), src)
    out = opforge.to_device_async(src, 0)
    torch.cuda.synchronize()
    assert out.device == torch.device("cuda", 0) and torch.equal(out.cpu(), src)
    back = opforge.to_device_async(out, "cpu")
    assert back.is_pinned() and back.stride() == out.stride()
    torch.cuda.synchronize()
    assert torch.equal(back, src)
    again = opforge.to_device_async(out, "cuda")
    torch.cuda.synchronize()
    assert again.data_ptr() != out.data_ptr() and torch.equal(again, out)


@pytest.mark.cuda
def test_cuda_record_stream():
    """A source allocated on stream A, copied on stream B, freed at once: the allocator must not
    hand its block to new work on A before B's copy has read it."""
    n = MB64
    want = rand((n,))
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(a):
        src = want.cuda()
    a.synchronize()
    dst = torch.empty(n, device="cuda")
    b.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(b):
        torch.cuda._sleep(int(2e8))  # the copy waits behind this
        opforge.copy_async(dst, src)
    del src
    with torch.cuda.stream(a):  # runs at once, while B sleeps
        junk = [torch.full((n,), -7.0, device="cuda") for _ in range(3)]
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), want)
    del junk
