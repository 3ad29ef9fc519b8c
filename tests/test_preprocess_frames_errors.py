"""opforge.preprocess_frames' errors: each message names the op and the argument (the Python
wrapper, the raw op's C++ checks, the fake kernel)."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICES
from preprocess_cases import check_exact, frames

import opforge

# --- errors: each message names the op and the argument -------------------------------------------


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
    # Frames that do not fit (dtype, rank, channels, sides): RuntimeError, as PyTorch's own ops.
    ("float frames", dict(frames=_X.float()), RuntimeError, r"frames must be uint8, got float32"),
    ("int16 frames", dict(frames=_X.short()), RuntimeError, r"frames must be uint8, got int16"),
    ("3-D", dict(frames=_X[0]), RuntimeError, r"frames must be 4-D \(N, H, W, C\), got 3-D"),
    ("5-D", dict(frames=_X[None]), RuntimeError, r"frames must be 4-D \(N, H, W, C\), got 5-D"),
    (
        "NCHW 3-D",
        dict(frames=_X[0], layout="NCHW"),
        RuntimeError,
        r"frames must be 4-D \(N, C, H, W\), got 3-D",
    ),
    ("C=2", dict(frames=_X[..., :2]), RuntimeError, r"frames must have 3 or 4 channels \(last dim\), got 2"),
    (
        "C=5",
        dict(frames=frames(1, 4, 6, c=5)),
        RuntimeError,
        r"frames must have 3 or 4 channels \(last dim\), got 5",
    ),
    ("C=1", dict(frames=_X[..., :1]), RuntimeError, r"frames must have 3 or 4 channels \(last dim\), got 1"),
    (
        "NCHW C=6",
        dict(frames=frames(1, 6, 4, c=5), layout="NCHW"),
        RuntimeError,
        r"frames must have 3 or 4 channels \(last dim\), got 6",
    ),
    ("H=0", dict(frames=frames(1, 0, 6)), RuntimeError, r"frames must have a height and width of at least 1"),
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
    # An argument of the wrong Python type: TypeError; a value out of range or unknown: ValueError.
    ("mean string", dict(mean="abc"), TypeError, r"mean must be a number or 3 numbers"),
    ("mean nan", dict(mean=[0, float("nan"), 0]), ValueError, r"mean must be finite"),
    ("std zero", dict(std=[0.2, 0.0, 0.2]), ValueError, r"std must be finite and nonzero"),
    ("std scalar zero", dict(std=0), ValueError, r"std must be finite and nonzero"),
    ("std inf", dict(std=[1, float("inf"), 1]), ValueError, r"std must be finite"),
    ("size 0", dict(size=0), ValueError, r"size must be positive, got \(0, 0\)"),
    ("size negative", dict(size=(-3, 5)), ValueError, r"size must be positive, got \(-3, 5\)"),
    ("size 3 values", dict(size=(3, 4, 5)), ValueError, r"size must be an int or \(height, width\)"),
    ("size 3.5", dict(size=3.5), TypeError, r"size must be an int or \(height, width\), got 3\.5"),
    ("size str", dict(size="ab"), TypeError, r"size must be an int or \(height, width\), got 'ab'"),
    ("size float", dict(size=(3.0, 4)), TypeError, r"size must be integers"),
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
    ("channels_in int", dict(channels_in=0), TypeError, r"channels_in must be one of .*, got 0"),
    (
        "channels_out None",
        dict(channels_out=None),
        TypeError,
        r"channels_out must be 'rgb' or 'bgr', got None",
    ),
    ("layout", dict(layout="HWC"), ValueError, r"layout must be 'NHWC' or 'NCHW', got 'HWC'"),
    ("layout int", dict(layout=4), TypeError, r"layout must be 'NHWC' or 'NCHW', got 4"),
    (
        "float64",
        dict(out_dtype=torch.float64),
        ValueError,
        r"out_dtype must be one of \(float16, bfloat16, float32\), got float64$",
    ),
    ("uint8 out", dict(out_dtype=torch.uint8), ValueError, r"out_dtype must be one of .*, got uint8$"),
    ("str out", dict(out_dtype="float16"), TypeError, r"out_dtype must be one of .*, got 'float16'$"),
    ("pad 300", dict(pad_value=300), ValueError, r"pad_value must be a pixel value in \[0, 255\], got 300"),
    ("pad -1", dict(pad_value=-1), ValueError, r"pad_value must be a pixel value in \[0, 255\], got -1"),
    ("scale inf", dict(scale=float("inf")), ValueError, r"scale must be a finite number"),
    ("scale str", dict(scale="1"), TypeError, r"scale must be a finite number, got '1'"),
    (
        "pad str",
        dict(pad_value="114"),
        TypeError,
        r"pad_value must be a pixel value in \[0, 255\], got '114'",
    ),
    (
        "pad bool",
        dict(pad_value=True),
        TypeError,
        r"pad_value must be a pixel value in \[0, 255\], got True",
    ),
    ("stride 0 without letterbox", dict(stride=0), ValueError, r"stride must be a positive integer, got 0"),
    (
        "stride negative without letterbox",
        dict(size=8, stride=-32),
        ValueError,
        r"stride must be a positive integer, got -32",
    ),
    ("stride bool", dict(stride=True), TypeError, r"stride must be a positive integer, got True"),
    ("stride float", dict(stride=32.0), TypeError, r"stride must be a positive integer, got 32\.0"),
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
        ValueError,
        r"out_dtype must be one of \(float16, bfloat16, float32\), got float64",
    ),
    ("size 2^31", dict(size=(2**31, 6), region=(0, 0, 4, 6)), ValueError, r"size must be below 2\^31"),
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


@pytest.mark.parametrize("name, kw, err, msg", RAW_BAD, ids=[c[0] for c in RAW_BAD])
def test_errors_raw_op_meta(name, kw, err, msg):
    """The fake kernel (meta tensors) checks every argument as the C++ checks do, with the same
    type and words: the numbers against float32 and the output dtype too."""
    with pytest.raises(err, match=r"opforge\.preprocess_frames: " + msg):
        _raw(_X.to("meta"), **kw)


def test_one_exception_type_per_condition():
    """The wrapper, the raw op and its fake kernel (FakeTensorMode, meta tensors) raise the same
    type with the same words: RuntimeError for frames that do not fit (as PyTorch's own ops raise
    for a tensor's dtype or shape), ValueError for an out_dtype the op does not produce."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cases = [
        (RuntimeError, _X[0], {}, r"frames must be 4-D \(N, H, W, C\), got 3-D$"),
        (RuntimeError, _X.float(), {}, r"frames must be uint8, got float32$"),
        (RuntimeError, _X[..., :2], {}, r"frames must have 3 or 4 channels \(last dim\), got 2$"),
        (
            ValueError,
            _X,
            dict(out_dtype=torch.float64),
            r"out_dtype must be one of \(float16, bfloat16, float32\), got float64$",
        ),
    ]
    for err, x, kw, msg in cases:
        with pytest.raises(err, match=r"^opforge\.preprocess_frames: " + msg) as wrapper:
            opforge.preprocess_frames(x, scale=1.0, **kw)
        raw_kw = dict(dtype=kw.get("out_dtype", torch.float32))
        with pytest.raises(err) as real:
            _raw(x, **raw_kw)
        with FakeTensorMode() as mode, pytest.raises(err) as fake:
            _raw(mode.from_tensor(x), **raw_kw)
        with pytest.raises(err) as meta:
            _raw(x.to("meta"), **raw_kw)
        assert str(wrapper.value) == str(real.value) == str(fake.value) == str(meta.value)


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
    with pytest.raises(RuntimeError, match=r"opforge\.preprocess_frames: frames must be uint8, got float32"):
        _raw(_X.float().to(device))
    with pytest.raises(
        RuntimeError, match=r"opforge\.preprocess_frames: frames must be 4-D \(N, H, W, C\), got 3-D"
    ):
        _raw(_X[0].to(device))
    with pytest.raises(RuntimeError, match=r"opforge\.preprocess_frames: frames must have 3 or 4 channels"):
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
