"""What the opforge.preprocess_frames tests share: output dtypes, normalizations, random frames,
the op called with a poisoned CUDA allocator, and the checks against the reference.
A helper module, not a test module: the test files import it."""

from __future__ import annotations

import numpy as np
import torch
from conftest import poison_cuda_allocator

import opforge
from opforge import reference
from opforge.ops.preprocess_frames import letterbox_geometry

OUT_DTYPES = [torch.float16, torch.bfloat16, torch.float32]
IMAGENET = dict(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
NORMS = {
    "default": {},
    "imagenet": IMAGENET,
    "mean scalar": dict(mean=0.5),
    "std only": dict(std=[0.3, 0.25, 0.2]),
    "scale 1": dict(scale=1.0),
    "scale 1 mean std": dict(scale=1.0, mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375]),
    "to [-1, 1] tensor mean": dict(scale=1 / 127.5, mean=torch.tensor([1.0, 1.0, 1.0]), std=1.0),
    "odd scale": dict(scale=0.0123, mean=[-1.5, 0.0, 2.25], pad_value=0),
    "numpy mean std": dict(mean=np.array(IMAGENET["mean"]), std=np.array(IMAGENET["std"], dtype=np.float32)),
    "one-value numpy mean, tensor std": dict(mean=np.array([0.5]), std=torch.tensor(0.25)),
}


def frames(n, h, w, c=3, device="cpu"):
    return torch.randint(0, 256, (n, h, w, c), dtype=torch.uint8, device=device)


def out_shape(x, kw):
    """(N, 3, h, w) of the op's output for frames x and the op's keyword arguments kw."""
    h, w = x.shape[2:4] if kw.get("layout") == "NCHW" else x.shape[1:3]
    size = kw.get("size")
    if kw.get("letterbox"):
        opts = {k: kw[k] for k in ("scaleup", "stride", "center") if k in kw}
        hw = letterbox_geometry((h, w), size, **opts).size
    else:
        hw = (h, w) if size is None else ((size, size) if isinstance(size, int) else tuple(size))
    return (x.shape[0], 3, *hw)


def call(x, **kw):
    """The op, with the CUDA allocator poisoned first (an output element never written is NaN)."""
    if x.is_cuda:
        n, c, h, w = out_shape(x, kw)
        poison_cuda_allocator(n * c * h * w * 4, str(x.device))
    return opforge.preprocess_frames(x, **kw)


def split(result, kw):
    """(tensor, FrameInfo or None) of a result of the op called with kw."""
    return result if kw.get("letterbox") else (result, None)


def tensor_of(result):
    return result[0] if isinstance(result, tuple) else result


def check_exact(x, **kw):
    """The op equals the plain-PyTorch chain bit for bit (on the CPU, from a contiguous copy)."""
    out, info = split(call(x, **kw), kw)
    want, want_info = split(reference.preprocess_frames(x.cpu().contiguous(), **kw), kw)
    assert info == want_info
    assert out.shape == want.shape and out.dtype == want.dtype and out.device == x.device
    assert out.is_contiguous()
    assert torch.equal(out.cpu(), want)
    return out  # the tensor


def max_err(a, b):
    """Max |a - b| (NaN when either holds a NaN, so that an unwritten element fails any bound)."""
    assert a.shape == b.shape, (a.shape, b.shape)
    if a.numel() == 0:
        return 0.0
    return (a.cpu().float() - b.cpu().float()).abs().max().item()


def check_resize(x, atol=1e-3, **kw):
    """Resized with scale 1 to float32: within atol of F.interpolate's bilinear (values 0..255)."""
    kw = dict(scale=1.0, out_dtype=torch.float32, **kw)
    result = call(x, **kw)
    out, info = split(result, kw)
    want, want_info = split(reference.preprocess_frames(x.cpu().contiguous(), **kw), kw)
    assert info == want_info
    assert out.device == x.device and out.dtype == torch.float32 and out.is_contiguous()
    assert max_err(out, want) <= atol
    return result
