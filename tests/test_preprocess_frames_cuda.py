"""opforge.preprocess_frames on CUDA: agreement with the CPU, streams, graphs, decoder frames."""

from __future__ import annotations

import itertools

import pytest
import torch
from preprocess_cases import IMAGENET, NORMS, OUT_DTYPES, call, frames, max_err, tensor_of

import opforge
from opforge import reference

# --- CUDA: agreement with the CPU, streams, graphs, decoder frames --------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=str)
def test_cuda_matches_cpu(dtype):
    for (n, h, w), c, norm in itertools.product(
        [(1, 1, 1), (2, 17, 31), (2, 8, 64), (1, 720, 1280)], (3, 4), ("default", "imagenet", "odd scale")
    ):
        x = frames(n, h, w, c=c)
        kw = dict(out_dtype=dtype, channels_in="bgr", **NORMS[norm])
        assert torch.equal(call(x.cuda(), **kw).cpu(), opforge.preprocess_frames(x, **kw))
        kw = dict(size=(h + 9, w + 16), letterbox=True, scaleup=False, out_dtype=dtype, **NORMS[norm])
        assert torch.equal(call(x.cuda(), **kw)[0].cpu(), opforge.preprocess_frames(x, **kw)[0])
        kw = dict(size=(h // 2 + 3, w * 2 + 1), scale=1.0, out_dtype=torch.float32)
        assert max_err(call(x.cuda(), **kw), opforge.preprocess_frames(x, **kw)) <= 1e-3
        kw = dict(size=640, letterbox=True, stride=32, scale=1.0, out_dtype=torch.float32)
        (got, gi), (want, wi) = call(x.cuda(), **kw), opforge.preprocess_frames(x, **kw)
        assert gi == wi and max_err(got, want) <= 1e-3


@pytest.mark.cuda
@pytest.mark.parametrize("resize", [False, True])
def test_cuda_side_stream(resize):
    """The kernel runs on the current stream: it must see the frames written before it there."""
    x = frames(2, 270, 480)
    kw = dict(size=(135, 241), **IMAGENET) if resize else dict(IMAGENET)
    want = opforge.preprocess_frames(x, **kw)
    src = x.cuda()
    d = torch.zeros_like(src)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # keep the stream busy: a launch on another stream reads zeros
        d.copy_(src)
        out = call(d, **kw)
    s.synchronize()
    assert torch.equal(out.cpu(), want)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "kw",
    [
        IMAGENET,
        dict(size=(100, 77), scale=1.0, out_dtype=torch.float32),
        dict(size=320, letterbox=True, stride=32),
    ],
    ids=["convert", "resize", "letterbox"],
)
def test_cuda_graph_capture(kw):
    x = frames(2, 180, 320)
    d = x.cuda()
    call(d, **kw)  # warm up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = opforge.preprocess_frames(d, **kw)
    out = out[0] if kw.get("letterbox") else out
    for _ in range(3):
        x = frames(2, 180, 320)
        d.copy_(x.cuda())
        g.replay()
        torch.cuda.synchronize()
        want = tensor_of(opforge.preprocess_frames(x, **kw))
        if "size" in kw:
            assert max_err(out, want) <= (1e-3 if want.dtype == torch.float32 else 2**-9 + 1e-5)
        else:
            assert torch.equal(out.cpu(), want)


@pytest.mark.cuda
@pytest.mark.parametrize("c", [3, 4])
def test_cuda_decoder_frames_nchw(c):
    """Frames a GPU decoder left in (N, C, H, W) (torchcodec) are read in place."""
    nchw = torch.randint(0, 256, (3, c, 360, 640), dtype=torch.uint8, device="cuda")
    nhwc = nchw.permute(0, 2, 3, 1).cpu().contiguous()
    out = call(nchw, layout="NCHW", **IMAGENET)
    assert torch.equal(out.cpu(), reference.preprocess_frames(nhwc, **IMAGENET))
    kw = dict(size=640, letterbox=True, stride=32, scale=1.0, out_dtype=torch.float32)
    (got, gi), (want, wi) = call(nchw, layout="NCHW", **kw), reference.preprocess_frames(nhwc, **kw)
    assert gi == wi and got.shape == (3, 3, 384, 640) and max_err(got, want) <= 1e-3  # pad only
    kw = dict(size=320, letterbox=True, stride=32, scale=1.0, out_dtype=torch.float32, channels_in="bgr")
    (got, gi), (want, wi) = call(nchw, layout="NCHW", **kw), reference.preprocess_frames(nhwc, **kw)
    assert gi == wi and got.shape == (3, 3, 192, 320) and max_err(got, want) <= 1e-3  # resized
