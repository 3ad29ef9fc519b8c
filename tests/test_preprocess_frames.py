"""opforge.preprocess_frames' kernels (CPU, and CUDA where parametrized by device): normalization,
layouts, resize (PyTorch and OpenCV), letterbox geometry (Ultralytics' rules), CPU threads.
Errors, opcheck / compile and the CUDA-only tests are in test_preprocess_frames_*.py."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import DEVICES
from preprocess_cases import (
    IMAGENET,
    NORMS,
    OUT_DTYPES,
    call,
    check_exact,
    check_resize,
    frames,
    max_err,
    tensor_of,
)

import opforge
from opforge import reference
from opforge.ops.preprocess_frames import FrameInfo, letterbox_geometry

# (N, H, W): 1x1, a 3-channel row of one pixel, odd sizes, vector-width rows, a wide frame, N = 0.
SHAPES = [(1, 1, 1), (2, 3, 1), (2, 17, 31), (3, 8, 16), (1, 127, 1000), (0, 5, 7)]
ORDERS = [("rgb", "rgb"), ("rgb", "bgr"), ("bgr", "rgb"), ("bgr", "bgr")]


def pad_value_normalized(pad, scale, mean, std, dtype):
    """The border value normalized like a pixel: float32, each operation rounded, then cast."""
    f = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    v = f(pad) * f(scale) - f(mean)
    return (v / f(std)).to(dtype)


# --- exact normalization without a resize ---------------------------------------------------------


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


# --- non-contiguous frames ------------------------------------------------------------------------


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


# --- resize against F.interpolate -----------------------------------------------------------------

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


# --- resize against OpenCV and an Ultralytics-style letterbox -------------------------------------

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


# --- letterbox geometry: Ultralytics' rules -------------------------------------------------------


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


# The frames of 1080p and up take 2-4 s each on 2 cores (the float reference at full size): slow.
OUTPUT_SHAPES = [
    pytest.param(shape, marks=pytest.mark.slow) if shape[0] * shape[1] >= 1080 * 1920 else shape
    for shape in GEOMETRY_SHAPES
]


@pytest.mark.parametrize("size", [640, (384, 640)], ids=str)
@pytest.mark.parametrize("shape", OUTPUT_SHAPES, ids=str)
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


# --- CPU threads ----------------------------------------------------------------------------------


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
