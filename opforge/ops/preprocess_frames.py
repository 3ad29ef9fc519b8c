"""opforge.preprocess_frames: video frames to a model's input in one pass over memory, and the
letterbox geometry (Ultralytics' rules) that maps boxes back to the frame."""

from __future__ import annotations

import math
import numbers
import struct
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from opforge.ops._common import dtype_name, require_tensor

OP = "opforge.preprocess_frames"
# One exception type per condition (docs/adding-an-op.md, section 3), the same from this wrapper,
# the C++ checks and the fake kernel: RuntimeError for frames whose dtype, shape or layout do not
# fit; ValueError for an argument whose value is out of range or unknown (size, region, scale, mean,
# std, pad_value, stride, a channel order or layout name, an out_dtype the op does not produce);
# TypeError for an argument of the wrong Python type.
OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_ORDERS = {"rgb": 0, "bgr": 1, "rgba": 0, "bgra": 1}
# A number x rounds to a finite value of the type when |x| is below these (to nearest even: the
# midpoint between the largest finite value and the next power of two rounds up, to inf).
_OVERFLOW = {
    torch.float16: 2.0**16 - 2.0**4,
    torch.bfloat16: 2.0**128 - 2.0**119,
    torch.float32: 2.0**128 - 2.0**103,
}
_F32_ZERO = 2.0**-150  # |x| up to this rounds to 0 in float32
_IN_F32 = "(the kernels compute in float32)"


class FrameInfo(NamedTuple):
    """Where the frames landed in the output of :func:`preprocess_frames` (the same for every frame
    of a batch): enough to map boxes back to the frame (:func:`opforge.video.scale_boxes`)."""

    shape: tuple[int, int]
    """(H, W) of the input frames."""
    size: tuple[int, int]
    """(h, w) of the output."""
    resized: tuple[int, int]
    """(h, w) of the resized frame inside the output."""
    pad: tuple[int, int]
    """(top, left): the resized frame's offset in the output (the border above and left of it)."""
    ratio: tuple[float, float]
    """(ratio_h, ratio_w): output pixels per input pixel (the letterbox gain r, twice)."""


def letterbox_geometry(
    shape: tuple[int, int],
    size: int | tuple[int, int],
    *,
    scaleup: bool = True,
    stride: int | None = None,
    center: bool = True,
) -> FrameInfo:
    """The letterbox of a frame of ``shape`` (H, W) into ``size``, by Ultralytics' ``LetterBox`` rules.

    ``r = min(h / H, w / W)`` (at most 1 when ``scaleup`` is False); the resized frame is
    ``(round(H * r), round(W * r))`` with Python's round-half-even; the padding ``dh = h - new_h``
    (``dh % stride`` with ``stride``: the minimal rectangle, Ultralytics' ``auto``) is split as
    ``top = round(dh / 2 - 0.1)``, ``bottom = round(dh / 2 + 0.1)`` when ``center`` (else all of it
    below), and the same for left and right.
    """
    height, width = (int(v) for v in shape)
    out_h, out_w = _pair("size", size)
    # r = min(out_h / height, out_w / width), chosen by exact integer comparison (a float division
    # is monotonic, so this is the same float): under torch.compile(dynamic=True) the sizes are
    # symbolic, and torch 2.11 returns min() of two symbolic floats wrongly (0.0).
    num, den = (out_h, height) if out_h * width <= out_w * height else (out_w, width)
    if not scaleup and num > den:
        num, den = 1, 1
    r = num / den
    new_w, new_h = round(width * r), round(height * r)
    # A frame far wider than tall can round a side to 0 pixels: keep one row/column of it.
    new_w, new_h = max(new_w, 1), max(new_h, 1)
    dw, dh = out_w - new_w, out_h - new_h
    if stride is not None:
        _check_stride(stride)
        dw, dh = dw % stride, dh % stride
    if center:
        top, bottom = round(dh / 2 - 0.1), round(dh / 2 + 0.1)
        left, right = round(dw / 2 - 0.1), round(dw / 2 + 0.1)
    else:
        top, bottom, left, right = 0, round(dh + 0.1), 0, round(dw + 0.1)
    return FrameInfo(
        shape=(height, width),
        size=(new_h + top + bottom, new_w + left + right),
        resized=(new_h, new_w),
        pad=(top, left),
        ratio=(r, r),
    )


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_stride(stride) -> None:
    if not _is_int(stride) or stride <= 0:
        err = ValueError if _is_int(stride) else TypeError  # 0 or -32; 32.0 or True
        raise err(f"{OP}: stride must be a positive integer, got {stride!r}")


def _check_str(arg: str, value, allowed) -> None:
    """A name among ``allowed``: TypeError when it is no str, ValueError when it is another one."""
    if not isinstance(value, str) or value not in allowed:
        err = ValueError if isinstance(value, str) else TypeError
        names = f"'{allowed[0]}' or '{allowed[1]}'" if len(allowed) == 2 else f"one of {sorted(allowed)}"
        raise err(f"{OP}: {arg} must be {names}, got {value!r}")


def _pair(arg: str, value) -> tuple[int, int]:
    if _is_int(value):
        value = (value, value)
    # (The message is made on the error paths only: torch.compile cannot format a symbolic size.)
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{OP}: {arg} must be an int or (height, width), got {value!r}")
    try:
        h, w = value
    except TypeError:  # not a sequence: 3.5, None
        raise TypeError(f"{OP}: {arg} must be an int or (height, width), got {value!r}") from None
    except ValueError:  # a sequence of 1 or 3 values
        raise ValueError(f"{OP}: {arg} must be an int or (height, width), got {value!r}") from None
    if not all(_is_int(v) for v in (h, w)):
        raise TypeError(f"{OP}: {arg} must be integers, got {value!r}")
    if h <= 0 or w <= 0:
        raise ValueError(f"{OP}: {arg} must be positive, got ({h}, {w})")
    return int(h), int(w)


def _three(arg: str, value) -> list[float]:
    """mean / std: None (= none), a number (the same for the 3 channels) or 3 numbers; a numpy
    array or tensor holds 3 numbers, or one (for all 3)."""
    if value is None:
        return []
    if isinstance(value, (torch.Tensor, np.ndarray)):
        value = value.flatten().tolist()
        if len(value) == 1:
            value = value * 3
    if isinstance(value, numbers.Real):
        value = [value] * 3
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise TypeError(f"{OP}: {arg} must be a number or 3 numbers (one per output channel), got {value!r}")
    if len(value) != 3:
        raise ValueError(f"{OP}: {arg} must have 3 values (one per output channel), got {len(value)}")
    return [float(v) for v in value]


def _check_float32(scale: float, mean: list[float], std: list[float]) -> None:
    """check_preprocess_frames_inputs' words: scale, mean and std are numbers float32 holds, std
    nonzero in it. (Comparisons only, also under torch.compile; NaN fails them.)"""
    f32 = _OVERFLOW[torch.float32]
    if not abs(scale) < f32:
        raise ValueError(f"{OP}: scale must be finite in float32 {_IN_F32}, got {scale!r}")
    if not all(abs(v) < f32 for v in mean):
        raise ValueError(f"{OP}: mean must be finite in float32 {_IN_F32}, got {mean}")
    if not all(_F32_ZERO < abs(v) < f32 for v in std):
        raise ValueError(f"{OP}: std must be finite and nonzero in float32 {_IN_F32}, got {std}")


def _f32(x: float) -> float:
    """x rounded to float32 (to nearest even; inf beyond its range). On two float32 values, one
    operation in double rounded so equals the float32 operation (double has over 2 x 24 + 2 bits)."""
    if not abs(x) < _OVERFLOW[torch.float32]:
        return math.copysign(math.inf, x)
    return struct.unpack("f", struct.pack("f", x))[0]


def _check_outputs(scale: float, mean: list[float], std: list[float], out_dtype: torch.dtype) -> None:
    """check_preprocess_frames_inputs' output check, in the same float32 arithmetic: pixel values 0
    and 255 normalize to finite values of out_dtype (and so does everything between them, the pad
    value included: the normalization is monotonic)."""
    s = _f32(scale)
    for k in range(3):
        for v in (0.0, 255.0):
            out = _f32(_f32(v * s) - (_f32(mean[k]) if mean else 0.0))
            if std:
                out = _f32(out / _f32(std[k]))
            if not abs(out) < _OVERFLOW[out_dtype]:
                raise ValueError(
                    f"{OP}: scale, mean and std must keep the normalized pixel values (0 to 255, and "
                    f"pad_value) finite in float32 and within {dtype_name(out_dtype)}'s range (largest "
                    f"{torch.finfo(out_dtype).max:g}), got {out:g} for pixel value {v:g} in output channel {k}"
                )


def _check_frames(frames: torch.Tensor) -> None:
    """check_preprocess_frames_inputs (csrc/preprocess_frames/preprocess_frames.cpp) for frames:
    RuntimeError for frames that do not fit, as PyTorch's own ops raise for a tensor's dtype or
    shape."""
    if frames.layout != torch.strided or frames.is_nested:
        raise RuntimeError(f"{OP}: frames must be a dense (strided) tensor")
    if frames.dtype != torch.uint8:
        raise RuntimeError(f"{OP}: frames must be uint8, got {dtype_name(frames.dtype)}")
    if frames.dim() != 4:
        raise RuntimeError(f"{OP}: frames must be 4-D (N, H, W, C), got {frames.dim()}-D")
    if frames.shape[3] not in (3, 4):
        raise RuntimeError(f"{OP}: frames must have 3 or 4 channels (last dim), got {frames.shape[3]}")
    if frames.shape[0] > 0 and (frames.shape[1] == 0 or frames.shape[2] == 0):
        raise RuntimeError(
            f"{OP}: frames must have a height and width of at least 1, got {list(frames.shape)}"
        )


def _check_out_dtype(out_dtype) -> None:
    """An out_dtype the op does not produce is a value out of range (ValueError); one that is no
    torch.dtype at all, the wrong type (TypeError). The same words either way."""
    if out_dtype not in OUT_DTYPES:
        names = ", ".join(dtype_name(d) for d in OUT_DTYPES)
        is_dtype = isinstance(out_dtype, torch.dtype)
        got = dtype_name(out_dtype) if is_dtype else repr(out_dtype)
        raise (ValueError if is_dtype else TypeError)(f"{OP}: out_dtype must be one of ({names}), got {got}")


def preprocess_frames(
    frames: torch.Tensor,
    *,
    size: int | tuple[int, int] | None = None,
    letterbox: bool = False,
    pad_value: float = 114,
    mean: float | Sequence[float] | None = None,
    std: float | Sequence[float] | None = None,
    scale: float = 1 / 255,
    out_dtype: torch.dtype = torch.float16,
    channels_in: str = "rgb",
    channels_out: str = "rgb",
    layout: str = "NHWC",
    scaleup: bool = True,
    stride: int | None = None,
    center: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, FrameInfo]:
    """Video frames to a model's input, in one pass over memory (each input byte read once, each
    output element written once).

    Args:
        frames: uint8 ``(N, H, W, C)`` with C = 3 or 4 (the 4th channel, alpha, is dropped), any
            strides, on the CPU or a CUDA device (frames a GPU decoder left there are read in place).
            ``layout="NCHW"`` takes ``(N, C, H, W)`` instead (torchcodec's frames).
        size: ``(h, w)`` (or one int for both) of the output. Without ``letterbox`` the frames are
            resized to it bilinearly; None keeps the frames' size.
        letterbox: resize keeping the aspect ratio and pad to ``size`` by Ultralytics' ``LetterBox``
            rules (:func:`letterbox_geometry`; ``scaleup``, ``stride`` and ``center`` as there).
        pad_value: the border's pixel value in [0, 255], normalized like the pixels (114: YOLO's gray).
        mean, std: per output channel (3 numbers, or one for all; a sequence, numpy array or tensor),
            after ``scale``: the output is ``(x * scale - mean) / std``; None = 0 and 1.
        scale: multiplies the uint8 value first (1/255: to [0, 1]).
        out_dtype: float16, bfloat16 or float32.
        channels_in: the frames' channel order, ``"rgb"`` or ``"bgr"`` (OpenCV's); ``"rgba"`` and
            ``"bgra"`` say the same for 4 channels.
        channels_out: the output's channel order, ``"rgb"`` or ``"bgr"``.

    Returns:
        ``(N, 3, h, w)`` contiguous of ``out_dtype`` on the frames' device; with ``letterbox`` a
        tuple ``(tensor, FrameInfo)``.

    Bilinear sampling is PyTorch's ``F.interpolate(mode="bilinear", align_corners=False,
    antialias=False)`` (source = (dst + 0.5) * in / out - 0.5, clamped at the edges), computed in
    float32 and never rounded to uint8 before normalization: within rounding of the PyTorch chain on
    float frames, and within one uint8 step of OpenCV's ``cv2.resize(INTER_LINEAR)`` (which rounds
    to uint8 in 11-bit fixed point). Without a resize the output is bit-identical to the chain
    ``((x.float() * scale - mean) / std).to(out_dtype)``.

    The arithmetic is float32's: ``scale``, ``mean`` and ``std`` must be finite in float32 (``std``
    nonzero in it: 1e-50 is 0), and the normalized values of pixels 0 and 255 finite in float32 and
    within ``out_dtype``'s range (float16: 65504), else a ValueError (no output of inf).
    """
    require_tensor(OP, "frames", frames)
    _check_str("layout", layout, ("NHWC", "NCHW"))
    if layout == "NCHW":
        if frames.dim() != 4:
            raise RuntimeError(f"{OP}: frames must be 4-D (N, C, H, W), got {frames.dim()}-D")
        frames = frames.permute(0, 2, 3, 1)
    _check_frames(frames)
    _check_str("channels_in", channels_in, tuple(_ORDERS))
    _check_str("channels_out", channels_out, ("rgb", "bgr"))
    _check_out_dtype(out_dtype)
    if not isinstance(scale, numbers.Real):
        raise TypeError(f"{OP}: scale must be a finite number, got {scale!r}")
    if not abs(scale) < math.inf:  # (NaN too; symbolic-friendly)
        raise ValueError(f"{OP}: scale must be a finite number, got {scale!r}")
    if isinstance(pad_value, bool) or not isinstance(pad_value, numbers.Real):
        raise TypeError(f"{OP}: pad_value must be a pixel value in [0, 255], got {pad_value!r}")
    if not 0 <= pad_value <= 255:
        raise ValueError(f"{OP}: pad_value must be a pixel value in [0, 255], got {pad_value!r}")
    mean_l, std_l = _three("mean", mean), _three("std", std)
    _check_float32(float(scale), mean_l, std_l)
    if stride is not None:
        _check_stride(stride)
    channels = [0, 1, 2] if _ORDERS[channels_in] == _ORDERS[channels_out] else [2, 1, 0]
    height, width = int(frames.shape[1]), int(frames.shape[2])
    if letterbox:
        if size is None:
            raise ValueError(f"{OP}: letterbox=True needs a size")
        # (An empty batch of 0 x 0 frames: the geometry of a 1 x 1 frame, the frames' own shape.)
        info = letterbox_geometry(
            (max(height, 1), max(width, 1)), size, scaleup=scaleup, stride=stride, center=center
        )._replace(shape=(height, width))
    else:
        out_h, out_w = (height, width) if size is None else _pair("size", size)
        info = FrameInfo(
            shape=(height, width),
            size=(out_h, out_w),
            resized=(out_h, out_w),
            pad=(0, 0),
            ratio=(out_h / max(height, 1), out_w / max(width, 1)),
        )
    if info.size[0] <= 0 or info.size[1] <= 0:  # size=None on empty frames
        raise ValueError(f"{OP}: size must be positive, got {info.size}")
    region = [info.pad[0], info.pad[1], info.resized[0], info.resized[1]]
    out = torch.ops.opforge.preprocess_frames.default(
        frames, list(info.size), region, float(scale), mean_l, std_l, float(pad_value), channels, out_dtype
    )
    return (out, info) if letterbox else out


_MAX_SIDE = 2**31  # the kernels index rows and columns in int


@torch.library.register_fake("opforge::preprocess_frames")
def _(frames, size, region, scale, mean, std, pad_value, channels, out_dtype):
    # check_preprocess_frames_inputs (csrc/preprocess_frames/preprocess_frames.cpp), in its order.
    _check_frames(frames)
    if len(size) != 2:
        raise ValueError(f"{OP}: size must be (height, width), got {len(size)} values")
    if not (size[0] > 0 and size[1] > 0):
        raise ValueError(f"{OP}: size must be positive, got {list(size)}")
    if len(region) != 4:
        raise ValueError(f"{OP}: region must be (top, left, height, width), got {len(region)} values")
    top, left, height, width = region
    if not (
        height > 0
        and width > 0
        and top >= 0
        and left >= 0
        and top + height <= size[0]
        and left + width <= size[1]
    ):
        raise ValueError(f"{OP}: region {list(region)} must lie inside the output size {list(size)}")
    if not abs(scale) < _OVERFLOW[torch.float32]:
        raise ValueError(f"{OP}: scale must be finite in float32 {_IN_F32}, got {scale!r}")
    for arg, values in (("mean", mean), ("std", std)):
        if len(values) not in (0, 3):
            raise ValueError(f"{OP}: {arg} must have 3 values (one per output channel), got {len(values)}")
    _check_float32(scale, list(mean), list(std))
    if not 0 <= pad_value <= 255:
        raise ValueError(f"{OP}: pad_value must be a pixel value in [0, 255], got {pad_value!r}")
    if list(channels) not in ([0, 1, 2], [2, 1, 0]):
        raise ValueError(
            f"{OP}: channels (the input channel of each output channel) must be [0, 1, 2] or [2, 1, 0], "
            f"got {list(channels)}"
        )
    _check_out_dtype(out_dtype)
    if frames.shape[1] >= _MAX_SIDE or frames.shape[2] >= _MAX_SIDE:
        raise RuntimeError(f"{OP}: frame sides must be below 2^31")
    if size[0] >= _MAX_SIDE or size[1] >= _MAX_SIDE:
        raise ValueError(f"{OP}: size must be below 2^31, got {list(size)}")
    _check_outputs(scale, list(mean), list(std), out_dtype)
    return frames.new_empty((frames.shape[0], 3, size[0], size[1]), dtype=out_dtype)
