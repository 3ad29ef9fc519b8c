"""opforge.preprocess_frames: normalization, layouts, resize (PyTorch and OpenCV), letterbox
geometry (Ultralytics' rules), errors, opcheck / compile, CUDA streams and graphs, CPU threads."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from conftest import DEVICES, poison_cuda_allocator

import opforge
from opforge import reference
from opforge.ops.preprocess_frames import FrameInfo, letterbox_geometry

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
# (N, H, W): 1x1, a 3-channel row of one pixel, odd sizes, vector-width rows, a wide frame, N = 0.
SHAPES = [(1, 1, 1), (2, 3, 1), (2, 17, 31), (3, 8, 16), (1, 127, 1000), (0, 5, 7)]
ORDERS = [("rgb", "rgb"), ("rgb", "bgr"), ("bgr", "rgb"), ("bgr", "bgr")]


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


def pad_value_normalized(pad, scale, mean, std, dtype):
    """The border value normalized like a pixel: float32, each operation rounded, then cast."""
    f = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    v = f(pad) * f(scale) - f(mean)
    return (v / f(std)).to(dtype)


# --- 1. exact normalization without a resize -------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("norm", list(NORMS), ids=str)
@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=str)
def test_exact_without_resize(device, dtype, norm, shape):
    for c, (cin, cout) in itertools.product((3, 4), ORDERS):
        if c == 4 and cin == "rgb":
            cin = "rgba"  # the same order, said for 4 channels ("rgb" is accepted too, below)
        x = frames(*shape, c=c, device=device)
        x0 = x.clone()
        out = check_exact(x, out_dtype=dtype, channels_in=cin, channels_out=cout, **NORMS[norm])
        assert out.shape == (shape[0], 3, shape[1], shape[2])
        assert torch.equal(x, x0)  # the frames are left alone


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=str)
def test_exact_random_normalization(device, dtype):
    """Random scale, mean and std (the kernels pick their arithmetic per call from what they verify
    exact for these parameters): every byte value of every channel, bit-identical to the chain."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    for _ in range(16):
        r = torch.rand(7, generator=g, dtype=torch.float64).tolist()
        scale = [1 / 255, 1.0, 1 / 127.5, 10 ** (4 * r[0] - 3)][int(r[6] * 4)]
        mean = [8 * v - 4 for v in r[1:4]]
        std = [10 ** (3 * v - 2) * (1 if v > 0.3 else -1) for v in r[3:6]]
        # 2 frames of 16 x 48 pixels: each channel holds every byte value, in a random order
        x = torch.stack([torch.randperm(256, generator=g) for _ in range(6)]).to(torch.uint8)
        x = x.view(2, 3, 16, 16).permute(0, 2, 3, 1).repeat(1, 1, 3, 1).to(device)
        # The largest normalized value (pixels 0 and 255 bound them): beyond float16's range the
        # parameters are refused; at its edge (within 0.1%) rounding decides, so the draw is skipped.
        largest = max(abs((p * scale - m) / sd) for p in (0, 255) for m, sd in zip(mean, std, strict=True))
        if dtype == torch.float16 and largest > 65504 * 1.001:
            with pytest.raises(ValueError, match=r"within float16's range \(largest 65504\)"):
                check_exact(x, out_dtype=dtype, scale=scale, mean=mean, std=std)
        elif dtype != torch.float16 or largest < 65504 * 0.999:
            check_exact(x, out_dtype=dtype, scale=scale, mean=mean, std=std)
        check_exact(x, out_dtype=dtype, scale=scale, mean=mean)


@pytest.mark.parametrize("device", DEVICES)
def test_exact_size_equal_to_frame_and_4_channel_names(device):
    """size = the frame's own size is no resize; 'rgb' on 4 channels means 'rgba'."""
    x = frames(2, 19, 23, c=4, device=device)
    a = check_exact(x, size=(19, 23), channels_in="bgr", **IMAGENET)
    b = check_exact(x, channels_in="bgra", **IMAGENET)
    assert torch.equal(a, b)
    # The alpha channel is dropped: changing it changes nothing.
    y = x.clone()
    y[..., 3] = torch.randint(0, 256, y[..., 3].shape, dtype=torch.uint8, device=device)
    assert torch.equal(check_exact(y, channels_in="bgra", **IMAGENET), b)
    # The swap is real: bgr in, rgb out reverses the planes (one mean and std for all three).
    c = opforge.preprocess_frames(x, channels_in="rgba", mean=0.4, std=0.2)
    assert torch.equal(
        c, opforge.preprocess_frames(x, channels_in="bgra", channels_out="bgr", mean=0.4, std=0.2)
    )
    assert torch.equal(c.flip(1), opforge.preprocess_frames(x, channels_in="bgra", mean=0.4, std=0.2))
    assert not torch.equal(c, c.flip(1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "hw, size, opts",
    [
        ((640, 640), 640, {}),
        ((480, 640), 640, {}),  # r = 1: pad only (80 rows above and below)
        ((480, 640), 640, dict(stride=32)),  # 160 % 32 = 0: neither resize nor pad
        ((470, 640), 640, dict(stride=32)),  # 170 % 32 = 10: 5 above, 5 below
        ((17, 31), 640, dict(scaleup=False)),  # small frames are not enlarged: a wide border
        ((17, 31), (40, 31), dict(center=False)),  # all of the pad below
        ((33, 20), (33, 27), {}),  # odd pad: 3 left, 4 right
        ((1, 1), (1, 8), {}),
    ],
    ids=str,
)
@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=str)
def test_exact_letterbox_without_resize(device, hw, size, opts, dtype):
    for norm in ("default", "imagenet", "odd scale"):
        x = frames(2, *hw, device=device)
        _, info = call(x, size=size, letterbox=True, out_dtype=dtype, **opts, **NORMS[norm])
        assert info.resized == hw
        check_exact(x, size=size, letterbox=True, out_dtype=dtype, **opts, **NORMS[norm])


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    x = frames(0, 30, 50, device=device)
    for kw, hw in (({}, (30, 50)), (dict(size=(9, 4)), (9, 4)), (dict(size=64, letterbox=True), (64, 64))):
        for dtype in OUT_DTYPES:
            out = tensor_of(opforge.preprocess_frames(x, out_dtype=dtype, **kw))
            assert out.shape == (0, 3, *hw) and out.dtype == dtype and out.device == x.device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hw", [(0, 0), (0, 7), (5, 0)], ids=str)
def test_empty_batch_of_empty_frames_info(device, hw):
    """FrameInfo.shape is the frames' (H, W) even when a side is 0 (an empty batch)."""
    x = frames(0, *hw, device=device)
    out, info = opforge.preprocess_frames(x, size=(32, 48), letterbox=True)
    assert out.shape == (0, 3, 32, 48) and info.shape == hw and info.size == (32, 48)
    out = opforge.preprocess_frames(x, size=(32, 48))
    assert out.shape == (0, 3, 32, 48)


# --- 2. non-contiguous frames ----------------------------------------------------------------


def _views(device):
    """(name, frames, kwargs): views a decoder or a numpy array can hand over."""
    x = frames(2, 20, 40, device=device)
    yield "crop", x[:, 3:-2, 5:-1, :], {}
    x4 = frames(2, 21, 33, c=4, device=device)
    yield "channel slice of RGBA", x4[..., :3], {}
    yield "channel slice of RGBA, offset 1", x4[..., 1:], {}
    planar = torch.randint(0, 256, (2, 3, 18, 26), dtype=torch.uint8, device=device)
    yield "planar memory permuted to NHWC", planar.permute(0, 2, 3, 1), {}
    yield "every other frame", frames(5, 9, 14, device=device)[::2], {}
    yield "transposed H and W", frames(2, 15, 11, device=device).transpose(1, 2), {}
    yield "stride-0 batch", frames(1, 7, 13, device=device).expand(3, 7, 13, 3), {}
    flat = torch.randint(0, 256, (2 * 13 * 29 * 3 + 1,), dtype=torch.uint8, device=device)
    yield "packed, 1 byte off alignment", flat[1:].view(2, 13, 29, 3), {}
    yield "every other column", frames(2, 10, 64, device=device)[:, :, ::2], {}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=str)
def test_non_contiguous(device, dtype):
    for name, x, kw in _views(device):
        for norm, cout in (("imagenet", "rgb"), ("odd scale", "bgr")):
            check_exact(x, out_dtype=dtype, channels_out=cout, **kw, **NORMS[norm])
            # Padded around the frame too.
            check_exact(
                x, size=(x.shape[1] + 5, x.shape[2] + 5), letterbox=True, scaleup=False, out_dtype=dtype
            )
        if dtype == torch.float32:
            # Resized: the strided reads agree with the reference (F.interpolate) too.
            check_resize(x, size=(x.shape[1] * 2 + 1, x.shape[2] // 2 + 1), channels_in="bgr")
            kw = dict(size=(7, 9), out_dtype=torch.float32)
            assert max_err(call(x, **kw), call(x.contiguous(), **kw)) <= 1e-3 / 255, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("c", [3, 4])
def test_layout_nchw(device, c):
    """layout='NCHW' takes (N, C, H, W) frames (torchcodec's), in any memory layout."""
    nchw = torch.randint(0, 256, (2, c, 24, 37), dtype=torch.uint8, device=device)
    nhwc = nchw.permute(0, 2, 3, 1).contiguous()
    channels_last = nhwc.permute(0, 3, 1, 2)  # an (N, C, H, W) view of NHWC memory
    for src in (nchw, channels_last):
        for kw in (IMAGENET, dict(channels_in="bgr", out_dtype=torch.float32)):
            out = call(src, layout="NCHW", **kw)
            assert torch.equal(out.cpu(), reference.preprocess_frames(nhwc.cpu(), **kw))
        out, info = call(src, layout="NCHW", size=64, letterbox=True, scale=1.0, out_dtype=torch.float32)
        want, want_info = reference.preprocess_frames(
            nhwc.cpu(), size=64, letterbox=True, scale=1.0, out_dtype=torch.float32
        )
        assert info == want_info and max_err(out, want) <= 1e-3


# --- 3. resize against F.interpolate ---------------------------------------------------------

RESIZES = [
    ((1, 1), (5, 7)),
    ((17, 31), (40, 23)),
    ((17, 31), (100, 200)),  # upscale
    ((127, 1000), (50, 333)),  # downscale, odd
    ((1080, 1920), (360, 640)),
    ((3, 5), (1, 1)),
    ((2, 9), (7, 2)),
    ((64, 64), (32, 32)),  # exactly 2x
    ((5, 300), (5, 17)),  # one side only
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hw, size", RESIZES, ids=str)
def test_resize_matches_interpolate(device, hw, size):
    n = 1 if hw[0] * hw[1] > 100_000 else 3
    for c, cin in ((3, "rgb"), (3, "bgr"), (4, "bgra")):
        out = check_resize(frames(n, *hw, c=c, device=device), size=size, channels_in=cin)
        assert out.shape == (n, 3, *size)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "hw, size, opts, out_size",
    [
        ((1080, 1920), 640, dict(stride=32), (384, 640)),
        ((1080, 1920), 640, {}, (640, 640)),
        ((1080, 1920), (384, 640), {}, (384, 640)),
        ((1920, 1080), 640, dict(stride=32), (640, 384)),
        ((17, 31), 64, dict(center=False), (64, 64)),
        ((300, 200), (100, 101), {}, (100, 101)),
    ],
    ids=str,
)
def test_resize_letterbox_matches_interpolate(device, hw, size, opts, out_size):
    out, info = check_resize(frames(1, *hw, device=device), size=size, letterbox=True, **opts)
    assert out.shape == (1, 3, *out_size) and info.size == out_size


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=str)
def test_resize_normalized(device, dtype):
    """Resized and normalized: the reference's values within the output type's rounding."""
    rtol = {torch.float16: 2**-10, torch.bfloat16: 2**-7, torch.float32: 1e-6}[dtype]
    x = frames(2, 45, 77, device=device)
    for kw in (IMAGENET, NORMS["scale 1 mean std"], NORMS["odd scale"]):
        for size, lb in (((30, 100), False), (96, True)):
            out = tensor_of(call(x, size=size, letterbox=lb, out_dtype=dtype, **kw))
            want = tensor_of(
                reference.preprocess_frames(x.cpu(), size=size, letterbox=lb, out_dtype=dtype, **kw)
            )
            scale, std = kw.get("scale", 1 / 255), kw.get("std", 1.0)
            atol = 1e-3 * scale / min(std if isinstance(std, list) else [std])
            torch.testing.assert_close(out.cpu().float(), want.float(), rtol=rtol, atol=atol)


# --- 4. resize against OpenCV and an Ultralytics-style letterbox -----------------------------

CV_RESIZES = [
    *RESIZES,
    ((480, 640), (720, 1280)),  # upscale 1.5x / 2x
    ((720, 1280), (406, 722)),
    ((33, 47), (33, 94)),
]


def _cv_chw(img):
    """An HxWx3 uint8 array as a (3, H, W) float tensor."""
    return torch.from_numpy(img).reshape(img.shape[0], img.shape[1], -1).permute(2, 0, 1).float()


@pytest.mark.parametrize("hw, size", CV_RESIZES, ids=str)
def test_resize_matches_opencv(hw, size):
    cv2 = pytest.importorskip("cv2")  # opencv is an optional test extra
    for c, cin in ((3, "rgb"), (3, "bgr"), (4, "rgba")):
        x = frames(1, *hw, c=c)
        out = call(x, size=size, scale=1.0, out_dtype=torch.float32, channels_in=cin, channels_out="bgr")
        want = _cv_chw(cv2.resize(x[0].numpy(), (size[1], size[0]), interpolation=cv2.INTER_LINEAR))[:3]
        if cin.startswith("rgb"):
            want = want.flip(0)  # the output is BGR
        assert max_err(out[0], want) <= 1.0 + 1e-3  # OpenCV rounds to uint8 (11-bit fixed point)


def ultralytics_letterbox(cv2, img, new_shape, auto=False, scaleup=True, center=True, stride=32):
    """Ultralytics' LetterBox (the uint8 image path), written out here."""
    shape = img.shape[:2]
    r = min(new_shape[0] / shape[0], new_shape[1] / shape[1])
    if not scaleup:
        r = min(r, 1.0)
    new_unpad = round(shape[1] * r), round(shape[0] * r)
    dw, dh = new_shape[1] - new_unpad[0], new_shape[0] - new_unpad[1]
    if auto:
        dw, dh = dw % stride, dh % stride
    if center:
        dw /= 2
        dh /= 2
    if shape[::-1] != new_unpad:
        img = cv2.resize(img, new_unpad, interpolation=cv2.INTER_LINEAR)
    top, bottom = round(dh - 0.1) if center else 0, round(dh + 0.1)
    left, right = round(dw - 0.1) if center else 0, round(dw + 0.1)
    img = cv2.copyMakeBorder(img, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(114, 114, 114))
    return img, (top, left), (new_unpad[1], new_unpad[0])


@pytest.mark.parametrize(
    "hw, size, opts",
    [
        ((1080, 1920), 640, {}),
        ((1080, 1920), 640, dict(stride=32)),
        ((1920, 1080), 640, dict(stride=32)),
        ((480, 640), 640, {}),
        ((17, 31), 640, {}),
        ((17, 31), 640, dict(scaleup=False)),
        ((375, 500), (384, 640), dict(center=False)),
        ((721, 1279), 320, {}),
    ],
    ids=str,
)
def test_letterbox_matches_ultralytics(hw, size, opts):
    cv2 = pytest.importorskip("cv2")  # opencv is an optional test extra
    x = frames(1, *hw)
    new_shape = (size, size) if isinstance(size, int) else size
    img, (top, left), (rh, rw) = ultralytics_letterbox(
        cv2,
        x[0].numpy(),
        new_shape,
        auto="stride" in opts,
        **{k: v for k, v in opts.items() if k != "stride"},
    )
    out, info = call(x, size=size, letterbox=True, scale=1.0, out_dtype=torch.float32, **opts)
    want = _cv_chw(img)
    assert out.shape[1:] == want.shape and info.pad == (top, left) and info.resized == (rh, rw)
    inside = torch.zeros(want.shape[1:], dtype=torch.bool)
    inside[top : top + rh, left : left + rw] = True
    assert torch.equal(out[0][:, ~inside], want[:, ~inside])  # the border: exactly 114
    assert (out[0][:, ~inside] == 114).all()
    assert max_err(out[0][:, inside], want[:, inside]) <= 1.0 + 1e-3


# --- 5. letterbox geometry: Ultralytics' rules ------------------------------------------------


def ultralytics_geometry(shape, size, scaleup=True, stride=None, center=True):
    """(pad (top, left), resized (h, w), size (h, w), r) by Ultralytics' LetterBox."""
    height, width = shape
    h, w = (size, size) if isinstance(size, int) else size
    r = min(h / height, w / width)
    if not scaleup:
        r = min(r, 1.0)
    new_w, new_h = round(width * r), round(height * r)
    dw, dh = w - new_w, h - new_h
    if stride:
        dw, dh = dw % stride, dh % stride
    if center:
        dw, dh = dw / 2, dh / 2
        top, bottom, left, right = round(dh - 0.1), round(dh + 0.1), round(dw - 0.1), round(dw + 0.1)
    else:
        top, left, bottom, right = 0, 0, round(dh + 0.1), round(dw + 0.1)
    return (top, left), (new_h, new_w), (new_h + top + bottom, new_w + left + right), r


GEOMETRY_SHAPES = [(1, 1), (17, 31), (1080, 1920), (2160, 3840), (1920, 1080), (640, 640), (480, 640)]
GEOMETRY_OPTS = [
    dict(scaleup=s, stride=st, center=c)
    for s, st, c in itertools.product((True, False), (None, 32), (True, False))
]


@pytest.mark.parametrize("size", [640, (384, 640)], ids=str)
@pytest.mark.parametrize("shape", GEOMETRY_SHAPES, ids=str)
def test_letterbox_geometry(shape, size):
    for opts in GEOMETRY_OPTS:
        pad, resized, out_size, r = ultralytics_geometry(shape, size, **opts)
        info = letterbox_geometry(shape, size, **opts)
        assert isinstance(info, FrameInfo)
        assert info == FrameInfo(shape=shape, size=out_size, resized=resized, pad=pad, ratio=(r, r)), opts
        if opts["stride"] is None:
            assert info.size == ((size, size) if isinstance(size, int) else size)


@pytest.mark.parametrize("size", [640, (384, 640)], ids=str)
@pytest.mark.parametrize("shape", GEOMETRY_SHAPES, ids=str)
def test_letterbox_output(shape, size):
    """The op's FrameInfo is the geometry; the border holds the normalized pad value exactly, the
    inside matches the reference."""
    x = frames(1, *shape)
    for opts in GEOMETRY_OPTS:
        pad, resized, out_size, _ = ultralytics_geometry(shape, size, **opts)
        out, info = call(x, size=size, letterbox=True, pad_value=100, **IMAGENET, **opts)
        assert info == letterbox_geometry(shape, size, **opts)
        assert out.shape == (1, 3, *out_size) and out.dtype == torch.float16
        inside = torch.zeros(out_size, dtype=torch.bool)
        inside[pad[0] : pad[0] + resized[0], pad[1] : pad[1] + resized[1]] = True
        for k in range(3):
            border = out[0, k][~inside]
            want = pad_value_normalized(100, 1 / 255, IMAGENET["mean"][k], IMAGENET["std"][k], torch.float16)
            assert torch.equal(border, want.expand(border.shape)), (opts, k)
        ref, ref_info = reference.preprocess_frames(
            x, size=size, letterbox=True, pad_value=100, **IMAGENET, **opts
        )
        assert ref_info == info
        if resized == shape:
            assert torch.equal(out, ref)
        else:
            # fp16 of values in about [-2.1, 2.7]: one rounding step (2^-9) at most.
            assert max_err(out[0][:, inside], ref[0][:, inside]) <= 2**-9 + 1e-3 / 255 / 0.224


def test_letterbox_extreme_aspect_keeps_a_row():
    """A side that rounds to 0 pixels keeps one (Ultralytics would ask cv2 for an empty image)."""
    x = frames(1, 1, 4000)
    out, info = call(x, size=640, letterbox=True, scale=1.0, out_dtype=torch.float32)
    assert info.resized == (1, 640) and info.size == (640, 640) and info.pad == (319, 0)
    want, _ = reference.preprocess_frames(x, size=640, letterbox=True, scale=1.0, out_dtype=torch.float32)
    assert max_err(out, want) <= 1e-3


def test_frame_info_without_letterbox():
    """Without letterbox the op returns only the tensor; its geometry is the plain resize."""
    out = opforge.preprocess_frames(frames(1, 10, 20), size=(5, 30))
    assert isinstance(out, torch.Tensor) and out.shape == (1, 3, 5, 30)
    out, info = opforge.preprocess_frames(frames(1, 10, 20), size=(5, 30), letterbox=True)
    assert isinstance(info, FrameInfo) and info.resized == (5, 10) and info.pad == (0, 10)
    assert info.shape == (10, 20) and info.ratio == (0.5, 0.5)


# --- 7. errors: each message names the op and the argument -------------------------------------


def out_range(dtype: str, largest: str, got: str) -> str:
    """The message (a regex) of outputs beyond the output dtype's range."""
    return (
        r"scale, mean and std must keep the normalized pixel values \(0 to 255, and pad_value\) finite in "
        rf"float32 and within {dtype}'s range \(largest {largest}\), got {got}"
    )


_X = frames(1, 4, 6)
BAD_CALLS = [
    ("list", dict(frames=[[1, 2, 3]]), TypeError, r"frames must be a torch\.Tensor, got list"),
    ("None", dict(frames=None), TypeError, r"frames must be a torch\.Tensor, got NoneType"),
    ("float frames", dict(frames=_X.float()), TypeError, r"frames must be uint8, got float32"),
    ("int16 frames", dict(frames=_X.short()), TypeError, r"frames must be uint8, got int16"),
    ("3-D", dict(frames=_X[0]), ValueError, r"frames must be 4-D \(N, H, W, C\), got 3-D"),
    ("5-D", dict(frames=_X[None]), ValueError, r"frames must be 4-D \(N, H, W, C\), got 5-D"),
    (
        "NCHW 3-D",
        dict(frames=_X[0], layout="NCHW"),
        ValueError,
        r"frames must be 4-D \(N, C, H, W\), got 3-D",
    ),
    ("C=2", dict(frames=_X[..., :2]), ValueError, r"frames must have 3 or 4 channels \(last dim\), got 2"),
    (
        "C=5",
        dict(frames=frames(1, 4, 6, c=5)),
        ValueError,
        r"frames must have 3 or 4 channels \(last dim\), got 5",
    ),
    ("C=1", dict(frames=_X[..., :1]), ValueError, r"frames must have 3 or 4 channels \(last dim\), got 1"),
    (
        "NCHW C=6",
        dict(frames=frames(1, 6, 4, c=5), layout="NCHW"),
        ValueError,
        r"frames must have 3 or 4 channels \(last dim\), got 6",
    ),
    ("H=0", dict(frames=frames(1, 0, 6)), ValueError, r"frames must have a height and width of at least 1"),
    (
        "mean of 2",
        dict(mean=[0.5, 0.5]),
        ValueError,
        r"mean must have 3 values \(one per output channel\), got 2",
    ),
    (
        "std of 4",
        dict(std=[1, 1, 1, 1]),
        ValueError,
        r"std must have 3 values \(one per output channel\), got 4",
    ),
    ("mean string", dict(mean="abc"), ValueError, r"mean must be a number or 3 numbers"),
    ("mean nan", dict(mean=[0, float("nan"), 0]), ValueError, r"mean must be finite"),
    ("std zero", dict(std=[0.2, 0.0, 0.2]), ValueError, r"std must be finite and nonzero"),
    ("std scalar zero", dict(std=0), ValueError, r"std must be finite and nonzero"),
    ("std inf", dict(std=[1, float("inf"), 1]), ValueError, r"std must be finite"),
    ("size 0", dict(size=0), ValueError, r"size must be positive, got \(0, 0\)"),
    ("size negative", dict(size=(-3, 5)), ValueError, r"size must be positive, got \(-3, 5\)"),
    ("size 3 values", dict(size=(3, 4, 5)), ValueError, r"size must be an int or \(height, width\)"),
    ("size float", dict(size=(3.0, 4)), ValueError, r"size must be integers"),
    ("letterbox size 0", dict(size=0, letterbox=True), ValueError, r"size must be positive"),
    ("letterbox no size", dict(letterbox=True), ValueError, r"letterbox=True needs a size"),
    (
        "stride 0",
        dict(size=64, letterbox=True, stride=0),
        ValueError,
        r"stride must be a positive integer, got 0",
    ),
    ("channels_in", dict(channels_in="rbg"), ValueError, r"channels_in must be one of .*, got 'rbg'"),
    (
        "channels_out",
        dict(channels_out="rgba"),
        ValueError,
        r"channels_out must be 'rgb' or 'bgr', got 'rgba'",
    ),
    ("layout", dict(layout="HWC"), ValueError, r"layout must be 'NHWC' or 'NCHW', got 'HWC'"),
    (
        "float64",
        dict(out_dtype=torch.float64),
        TypeError,
        r"out_dtype must be one of \(float16, bfloat16, float32\)",
    ),
    ("uint8 out", dict(out_dtype=torch.uint8), TypeError, r"out_dtype must be one of"),
    ("pad 300", dict(pad_value=300), ValueError, r"pad_value must be a pixel value in \[0, 255\], got 300"),
    ("pad -1", dict(pad_value=-1), ValueError, r"pad_value must be a pixel value in \[0, 255\], got -1"),
    ("scale inf", dict(scale=float("inf")), ValueError, r"scale must be a finite number"),
    (
        "pad bool",
        dict(pad_value=True),
        ValueError,
        r"pad_value must be a pixel value in \[0, 255\], got True",
    ),
    ("stride 0 without letterbox", dict(stride=0), ValueError, r"stride must be a positive integer, got 0"),
    (
        "stride negative without letterbox",
        dict(size=8, stride=-32),
        ValueError,
        r"stride must be a positive integer, got -32",
    ),
    ("stride bool", dict(stride=True), ValueError, r"stride must be a positive integer, got True"),
    ("stride float", dict(stride=32.0), ValueError, r"stride must be a positive integer, got 32\.0"),
    # Numbers float32 (the kernels' arithmetic) cannot hold, or outputs beyond the output dtype.
    ("scale 1e39", dict(scale=1e39), ValueError, r"scale must be finite in float32 .*, got 1e\+39"),
    (
        "mean 1e39",
        dict(mean=[0, 1e39, 0]),
        ValueError,
        r"mean must be finite in float32 .*, got \[0\.0, 1e\+39",
    ),
    ("std 1e-50", dict(std=1e-50), ValueError, r"std must be finite and nonzero in float32 .*, got \[1e-50"),
    (
        "float16 overflow",
        dict(scale=1.0, std=1e-3),
        ValueError,
        out_range("float16", "65504", "255000 for pixel value 255 in output channel 0"),
    ),
    (
        "bfloat16 overflow",
        dict(scale=1.0, mean=[0, 0, -3.4e38], out_dtype=torch.bfloat16),
        ValueError,
        out_range("bfloat16", r"3\.38953e\+38", r"3\.4e\+38 for pixel value 0 in output channel 2"),
    ),
    (
        "float32 overflow",
        dict(scale=1e37, out_dtype=torch.float32),
        ValueError,
        out_range("float32", r"3\.40282e\+38", "inf for pixel value 255 in output channel 0"),
    ),
    (
        "float32 overflow in the division",
        dict(mean=-1, std=[1, -1e-39, 1], out_dtype=torch.float32),
        ValueError,
        out_range("float32", r"3\.40282e\+38", "-inf for pixel value 0 in output channel 1"),
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, kw, err, msg", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_errors(device, name, kw, err, msg):
    kw = dict(kw)
    x = kw.pop("frames", _X)
    if isinstance(x, torch.Tensor):
        x = x.to(device)
    with pytest.raises(err, match=r"opforge\.preprocess_frames: " + msg):
        opforge.preprocess_frames(x, **kw)


def _raw(
    frames_,
    size=(4, 6),
    region=(0, 0, 4, 6),
    scale=1.0,
    mean=(),
    std=(),
    pad=114.0,
    channels=(0, 1, 2),
    dtype=torch.float32,
):
    return torch.ops.opforge.preprocess_frames.default(
        frames_, list(size), list(region), scale, list(mean), list(std), pad, list(channels), dtype
    )


RAW_BAD = [
    (
        "region past the bottom",
        dict(region=(1, 0, 4, 6)),
        ValueError,
        r"region \[1, 0, 4, 6\] must lie inside the output size \[4, 6\]",
    ),
    (
        "region past the right",
        dict(size=(8, 8), region=(0, 3, 4, 6)),
        ValueError,
        r"region \[0, 3, 4, 6\] must lie inside the output size \[8, 8\]",
    ),
    ("region empty", dict(region=(0, 0, 0, 6)), ValueError, r"region \[0, 0, 0, 6\] must lie inside"),
    (
        "region negative",
        dict(size=(8, 8), region=(-1, 0, 4, 6)),
        ValueError,
        r"region \[-1, 0, 4, 6\] must lie inside",
    ),
    (
        "region 3 values",
        dict(region=(0, 0, 4)),
        ValueError,
        r"region must be \(top, left, height, width\), got 3 values",
    ),
    ("size 0", dict(size=(0, 6)), ValueError, r"size must be positive, got \[0, 6\]"),
    ("size 1 value", dict(size=(4,)), ValueError, r"size must be \(height, width\), got 1 values"),
    (
        "channels",
        dict(channels=(0, 0, 0)),
        ValueError,
        r"channels \(the input channel of each output channel\) must be \[0, 1, 2\] or \[2, 1, 0\], got \[0, 0, 0\]",
    ),
    ("channels 2", dict(channels=(0, 1)), ValueError, r"channels .* must be \[0, 1, 2\] or \[2, 1, 0\]"),
    (
        "mean 2",
        dict(mean=(1.0, 2.0)),
        ValueError,
        r"mean must have 3 values \(one per output channel\), got 2",
    ),
    ("std zero", dict(std=(1.0, 0.0, 1.0)), ValueError, r"std must be finite and nonzero"),
    ("pad 256", dict(pad=256.0), ValueError, r"pad_value must be a pixel value in \[0, 255\]"),
    ("scale nan", dict(scale=float("nan")), ValueError, r"scale must be finite"),
    (
        "float64",
        dict(dtype=torch.float64),
        TypeError,
        r"out_dtype must be one of \(float16, bfloat16, float32\), got float64",
    ),
]

# Numbers float32 (the kernels' arithmetic) cannot hold, outputs beyond the output dtype's range:
# the C++ checks and the fake kernel's (meta tensors, torch.compile) say the same words.
RAW_RANGE_BAD = [
    (
        "scale 1e39",
        dict(scale=1e39),
        ValueError,
        r"scale must be finite in float32 \(the kernels compute in float32\), got 1e\+39",
    ),
    (
        "mean -1e39",
        dict(mean=(1.5, -1e39, 1.5)),
        ValueError,
        r"mean must be finite in float32 \(the kernels compute in float32\), got \[1\.5, -1e\+39, 1\.5\]",
    ),
    (
        "std 1e-50",
        dict(std=(1e-50, 1e-50, 1e-50)),
        ValueError,
        r"std must be finite and nonzero in float32 \(the kernels compute in float32\), got \[1e-50, 1e-50, 1e-50\]",
    ),
    (
        "float16 overflow",
        dict(std=(1e-3, 1e-3, 1e-3), dtype=torch.float16),
        ValueError,
        out_range("float16", "65504", "255000 for pixel value 255 in output channel 0"),
    ),
    (
        "bfloat16 overflow",
        dict(mean=(1.5, 1.5, -3.4e38), dtype=torch.bfloat16),
        ValueError,
        out_range("bfloat16", r"3\.38953e\+38", r"3\.4e\+38 for pixel value 0 in output channel 2"),
    ),
    (
        "float32 overflow",
        dict(scale=1e37),
        ValueError,
        out_range("float32", r"3\.40282e\+38", "inf for pixel value 255 in output channel 0"),
    ),
]
RAW_BAD += RAW_RANGE_BAD


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, kw, err, msg", RAW_BAD, ids=[c[0] for c in RAW_BAD])
def test_errors_raw_op(device, name, kw, err, msg):
    """The C++ checks (the raw op, as torch.ops sees it) raise the same kinds, naming the argument."""
    with pytest.raises(err, match=r"opforge\.preprocess_frames: " + msg):
        _raw(_X.to(device), **kw)


@pytest.mark.parametrize("name, kw, err, msg", RAW_RANGE_BAD, ids=[c[0] for c in RAW_RANGE_BAD])
def test_errors_raw_op_meta_range(name, kw, err, msg):
    """The fake kernel checks the numbers against float32 and the output dtype as the C++ checks do."""
    with pytest.raises(err, match=r"opforge\.preprocess_frames: " + msg):
        _raw(_X.to("meta"), **kw)


def test_range_edges_are_accepted():
    """Outputs up to the largest finite value of the output dtype pass the checks, bit-identical to
    the chain: 255 / std rounding to fp16's 65504, float32 outputs near 3.4e38."""
    x = frames(2, 5, 7)
    x[0, 0, 0] = 255
    for kw in (
        dict(scale=1.0, std=255 / 65519, out_dtype=torch.float16),
        dict(scale=1.0, std=255 / 3.4e38, out_dtype=torch.float32),
        dict(scale=1e36, mean=[-8e37, 0, 8e37], out_dtype=torch.float32),
    ):
        out = check_exact(x, **kw)
        assert torch.isfinite(out).all() and out.abs().max() > torch.finfo(out.dtype).max / 2


@pytest.mark.parametrize("device", DEVICES)
def test_errors_raw_op_frames(device):
    with pytest.raises(TypeError, match=r"opforge\.preprocess_frames: frames must be uint8, got float32"):
        _raw(_X.float().to(device))
    with pytest.raises(
        ValueError, match=r"opforge\.preprocess_frames: frames must be 4-D \(N, H, W, C\), got 3-D"
    ):
        _raw(_X[0].to(device))
    with pytest.raises(ValueError, match=r"opforge\.preprocess_frames: frames must have 3 or 4 channels"):
        _raw(_X[..., :2].to(device))
    # A valid raw call: the region of the output, the pad value around it.
    out = _raw(_X.to(device), size=(6, 9), region=(1, 2, 4, 6), pad=7.0)
    assert torch.equal(out[:, :, 1:5, 2:8].cpu(), _X.permute(0, 3, 1, 2).float())
    border = torch.ones(6, 9, dtype=torch.bool)
    border[1:5, 2:8] = False
    assert (out[:, :, border] == 7.0).all()


def test_meta_frames():
    x = torch.empty(2, 30, 40, 3, dtype=torch.uint8, device="meta")
    out = opforge.preprocess_frames(x, size=(8, 12), out_dtype=torch.bfloat16)
    assert out.shape == (2, 3, 8, 12) and out.device.type == "meta" and out.dtype == torch.bfloat16
    out, info = opforge.preprocess_frames(x, size=64, letterbox=True, stride=32)
    assert out.shape == (2, 3, 64, 64) and info.resized == (48, 64)


# --- 8. opcheck and torch.compile ------------------------------------------------------------


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


# --- 9. CUDA: agreement with the CPU, streams, graphs, decoder frames ----------------------------


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


# --- 10. CPU threads ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        dict(IMAGENET),
        dict(size=640, letterbox=True, stride=32, **IMAGENET),
        dict(size=(540, 960), out_dtype=torch.float32),
    ],
    ids=["convert", "letterbox", "resize"],
)
def test_cpu_threads_same_bits(kw):
    x = frames(4, 1080, 1920)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = tensor_of(opforge.preprocess_frames(x, **kw))
        torch.set_num_threads(2)
        two = tensor_of(opforge.preprocess_frames(x, **kw))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    if "size" not in kw:
        assert torch.equal(one, reference.preprocess_frames(x, **kw))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axis", ["width", "height"])
def test_resize_source_index_clamped_near_2_pow_23(device, axis):
    """Near 2^23 pixels float32 rounds the last output pixel's source position up to the side's
    length: the tap must stay on the frame's last pixel (a pixel beyond it here is 255, the frame 0)."""
    side = (1 << 23) + 2
    shape = (1, 1, side + 1, 3) if axis == "width" else (1, side + 1, 1, 3)
    big = torch.zeros(shape, dtype=torch.uint8, device=device)
    if axis == "width":
        big[:, :, side] = 255
        x, size = big[:, :, :side], (1, side + 2)
    else:
        big[:, side] = 255
        x, size = big[:, :side], (side + 2, 1)
    got = call(x, size=size, scale=1.0, out_dtype=torch.float32)
    assert got.abs().max().item() == 0.0


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
