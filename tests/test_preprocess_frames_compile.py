"""opforge.preprocess_frames under torch.library.opcheck and torch.compile."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICES
from preprocess_cases import IMAGENET, frames

import opforge
from opforge import reference

# --- opcheck and torch.compile --------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = frames(2, 12, 20, device=device)
    x4 = frames(1, 9, 7, c=4, device=device)
    samples = [
        (x, [12, 20], [0, 0, 12, 20], 1 / 255, [], [], 114.0, [0, 1, 2], torch.float16),
        (
            x,
            [20, 20],
            [4, 0, 12, 20],
            1 / 255,
            IMAGENET["mean"],
            IMAGENET["std"],
            114.0,
            [2, 1, 0],
            torch.bfloat16,
        ),
        (x, [7, 31], [0, 0, 7, 31], 1.0, [1.0, 2.0, 3.0], [], 0.0, [0, 1, 2], torch.float32),  # resized
        (x4, [16, 16], [3, 2, 10, 13], 0.5, [], [2.0, 2.0, 2.0], 255.0, [2, 1, 0], torch.float16),
        (x[:, 1:-1, ::2, :], [10, 10], [0, 0, 10, 10], 1 / 255, [], [], 114.0, [0, 1, 2], torch.float32),
        (
            frames(0, 5, 5, device=device),
            [5, 5],
            [0, 0, 5, 5],
            1 / 255,
            [],
            [],
            114.0,
            [0, 1, 2],
            torch.float16,
        ),
    ]
    for args in samples:
        torch.library.opcheck(torch.ops.opforge.preprocess_frames.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    torch._dynamo.reset()

    def f(x):
        a = opforge.preprocess_frames(x, **IMAGENET)
        b, info = opforge.preprocess_frames(x, size=48, letterbox=True, stride=16, out_dtype=torch.float32)
        c = opforge.preprocess_frames(x, size=(13, 9), channels_in="bgr", scale=1.0, out_dtype=torch.float32)
        return a, b[:, :, info.pad[0] :], c + 1

    x = frames(2, 24, 36, device=device)
    got, want = torch.compile(f, fullgraph=True)(x), f(x)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype and torch.equal(g, w)
    assert torch.equal(want[0].cpu(), reference.preprocess_frames(x.cpu(), **IMAGENET))


def test_error_compile_same_words():
    torch._dynamo.reset()
    f = torch.compile(lambda x: opforge.preprocess_frames(x, size=8), fullgraph=True)
    with pytest.raises(Exception, match=r"opforge\.preprocess_frames: frames must have 3 or 4 channels"):
        f(frames(1, 4, 4, c=2))


def test_error_compile_range_same_words():
    """An output beyond the output dtype's range, found by the fake kernel while tracing."""
    torch._dynamo.reset()
    f = torch.compile(lambda x: opforge.preprocess_frames(x, scale=1.0, std=1e-3), fullgraph=True)
    with pytest.raises(Exception, match=r"opforge\.preprocess_frames: scale, mean and std must keep"):
        f(frames(1, 4, 4))


@pytest.mark.parametrize(
    "kw",
    [dict(mean=0.5, std=0.5), dict(size=64, letterbox=True), dict(size=(40, 50))],
    ids=["norm", "letterbox", "resize"],
)
def test_compile_dynamic_shapes(kw):
    """torch.compile(dynamic=True): the geometry is computed from symbolic sizes, no graph break."""
    f = torch.compile(lambda x: opforge.preprocess_frames(x, **kw), fullgraph=True, dynamic=True)
    for shape in [(2, 100, 120, 3), (3, 90, 131, 3)]:
        x = frames(*shape[:3])
        got, want = f(x), opforge.preprocess_frames(x, **kw)
        if isinstance(want, tuple):
            assert got[1] == want[1]
            got, want = got[0], want[0]
        assert torch.equal(got, want)
