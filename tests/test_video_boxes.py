"""opforge.video.scale_boxes: letterboxed and resized boxes back to frame pixels."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICES
from video_cases import rand

from opforge.ops.preprocess_frames import FrameInfo, letterbox_geometry
from opforge.video import FrameStream, scale_boxes

# --- scale_boxes ----------------------------------------------------------------------------------


def boxes_in(height: int, width: int, n: int) -> torch.Tensor:
    """n random boxes (x1, y1, x2, y2) inside a frame of (height, width)."""
    size = torch.tensor([width, height], dtype=torch.float32)
    xy1 = torch.rand(n, 2) * size * 0.9
    xy2 = xy1 + torch.rand(n, 2) * (size - xy1)
    return torch.cat([xy1, xy2], dim=1)


def forward(boxes: torch.Tensor, info: FrameInfo) -> torch.Tensor:
    """Frame pixels -> the preprocessed output's pixels."""
    top, left = info.pad
    ratio_h, ratio_w = info.ratio
    out = boxes.clone()
    out[..., 0::2] = out[..., 0::2] * ratio_w + left
    out[..., 1::2] = out[..., 1::2] * ratio_h + top
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "shape, size, opts",
    [
        ((1080, 1920), 640, {}),
        ((1080, 1920), 640, dict(center=False)),
        ((720, 1280), (384, 640), {}),
        ((480, 640), 320, dict(stride=32)),
        ((300, 200), 256, dict(scaleup=False)),
        ((1920, 1080), 640, {}),
    ],
    ids=str,
)
def test_scale_boxes_inverts_letterbox(device, shape, size, opts):
    info = letterbox_geometry(shape, size, **opts)
    boxes = boxes_in(*shape, 64).to(device)
    mapped = forward(boxes, info)
    h, w = info.size
    assert (mapped[:, 0::2] >= 0).all() and (mapped[:, 0::2] <= w + 1e-3).all()
    assert (mapped[:, 1::2] >= 0).all() and (mapped[:, 1::2] <= h + 1e-3).all()
    before = mapped.clone()
    back = scale_boxes(mapped, info)
    assert torch.equal(mapped, before)  # a new tensor, the input untouched
    assert back.dtype == torch.float32 and back.device == mapped.device and back.shape == mapped.shape
    torch.testing.assert_close(back, boxes, rtol=1e-5, atol=1e-3)
    # Any leading dims.
    batched = scale_boxes(mapped.view(4, 16, 4), info)
    torch.testing.assert_close(batched, boxes.view(4, 16, 4), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_scale_boxes_clip(device):
    info = letterbox_geometry((1080, 1920), 640)
    assert info.pad == (140, 0) and info.ratio == (1 / 3, 1 / 3)
    fixed = torch.tensor([[-40.0, 100.0, 700.0, 600.0], [10.0, 150.0, 20.0, 480.0]])
    boxes = torch.cat([fixed, torch.rand(30, 4) * 760 - 60]).to(device)  # some in the pads and beyond
    unclipped = scale_boxes(boxes, info, clip=False)
    want = boxes.clone()
    want[:, 0::2] = want[:, 0::2] / (1 / 3)
    want[:, 1::2] = (want[:, 1::2] - 140) / (1 / 3)
    torch.testing.assert_close(unclipped, want, rtol=1e-5, atol=1e-3)
    assert unclipped[0, 0] < 0 and unclipped[0, 1] < 0 and unclipped[0, 2] > 1920 and unclipped[0, 3] > 1080
    clipped = scale_boxes(boxes, info)
    assert torch.equal(clipped[:, 0::2], unclipped[:, 0::2].clamp(0, 1920))
    assert torch.equal(clipped[:, 1::2], unclipped[:, 1::2].clamp(0, 1080))
    torch.testing.assert_close(clipped[0], torch.tensor([0.0, 0.0, 1920.0, 1080.0], device=device))
    torch.testing.assert_close(clipped[1], want[1])  # inside the frame: unchanged by the clip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8], ids=str)
def test_scale_boxes_integer(device, dtype):
    info = letterbox_geometry((720, 1280), 320)
    boxes = torch.randint(0, 250, (20, 4), device=device).to(dtype)
    back = scale_boxes(boxes, info, clip=False)
    assert back.is_floating_point() and back.dtype == torch.float32
    torch.testing.assert_close(back, scale_boxes(boxes.float(), info, clip=False))
    top, left = info.pad
    r = info.ratio[0]
    torch.testing.assert_close(back[:, 0], (boxes[:, 0].float() - left) / r)
    torch.testing.assert_close(back[:, 1], (boxes[:, 1].float() - top) / r)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=str)
def test_scale_boxes_keeps_float_dtype(dtype):
    info = letterbox_geometry((480, 640), 320)
    boxes = boxes_in(480, 640, 10)
    back = scale_boxes(forward(boxes, info).to(dtype), info)
    assert back.dtype == dtype
    torch.testing.assert_close(back.float(), boxes, rtol=2e-3, atol=1.0 if dtype == torch.float16 else 1e-6)


def test_scale_boxes_errors():
    info = letterbox_geometry((480, 640), 320)
    with pytest.raises(RuntimeError, match=r"shape \(\.\.\., 4\)"):
        scale_boxes(torch.zeros(5, 5), info)
    with pytest.raises(RuntimeError, match=r"shape \(\.\.\., 4\)"):
        scale_boxes(torch.zeros(4, 2), info)
    with pytest.raises(RuntimeError, match=r"shape \(\.\.\., 4\)"):
        scale_boxes(torch.tensor(1.0), info)
    with pytest.raises(TypeError, match="info must be a FrameInfo, got tuple"):
        scale_boxes(torch.zeros(3, 4), tuple(info))
    with pytest.raises(TypeError, match="info must be a FrameInfo, got NoneType"):
        scale_boxes(torch.zeros(3, 4), None)
    with pytest.raises(TypeError, match=r"boxes must be a torch\.Tensor, got list"):
        scale_boxes([[0, 0, 1, 1]], info)


@pytest.mark.parametrize("device", DEVICES)
def test_scale_boxes_plain_resize_info(device):
    """The FrameInfo of a plain (aspect-changing) resize: two ratios, no pads."""
    frames = rand(2, 90, 160)
    (b,) = FrameStream([frames], batch_size=2, device=device, size=(64, 96))
    info = b.info
    assert info == FrameInfo((90, 160), (64, 96), (64, 96), (0, 0), (64 / 90, 96 / 160))
    assert info.ratio[0] != info.ratio[1]
    boxes = boxes_in(90, 160, 32).to(device)
    mapped = boxes.clone()
    mapped[:, 0::2] *= 96 / 160
    mapped[:, 1::2] *= 64 / 90
    torch.testing.assert_close(scale_boxes(mapped, info), boxes, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_scale_boxes_with_stream_letterbox_info(device):
    frames = rand(3, 90, 160)
    (b,) = FrameStream([frames], batch_size=4, device=device, size=64, letterbox=True)
    assert b.info == letterbox_geometry((90, 160), 64)
    boxes = boxes_in(90, 160, 16).to(device)
    torch.testing.assert_close(scale_boxes(forward(boxes, b.info), b.info), boxes, rtol=1e-5, atol=1e-3)
