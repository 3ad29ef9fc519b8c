"""opforge.video.read_frames and write_clip (PyAV), and a FrameStream of read_frames."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES
from video_cases import check_stream

from opforge.video import FrameStream, read_frames, write_clip

# --- read_frames and write_clip -------------------------------------------------------------------


def smooth_frames(n: int, h: int = 64, w: int = 96) -> torch.Tensor:
    """Random smooth (N, H, W, 3) uint8 frames (a coarse random grid, upsampled): a lossy codec
    keeps them close. Each frame is different, so a frame out of order shows."""
    coarse = torch.rand(n, 3, 3, 4) * 255
    img = F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=True)
    return img.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


@pytest.fixture
def clip(tmp_path):
    pytest.importorskip("av")
    frames = smooth_frames(10)
    path = tmp_path / "clip.mp4"
    write_clip(str(path), frames)
    return str(path), frames


def mae(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().mean().item()


def test_read_frames(clip):
    path, original = clip
    batches = list(read_frames(path, batch_size=4))
    assert [b.shape[0] for b in batches] == [4, 4, 2]
    assert all(
        isinstance(b, torch.Tensor) and b.dtype == torch.uint8 and b.device.type == "cpu" for b in batches
    )
    decoded = torch.cat(batches)
    assert decoded.shape == (10, 64, 96, 3)
    errors = torch.tensor([[mae(d, o) for o in original] for d in decoded])
    assert (errors.diagonal() < 8).all(), errors.diagonal()
    assert torch.equal(errors.argmin(dim=1), torch.arange(10))  # each frame in its place
    # Every batch is its own buffer: one frame at a time decodes the same frames.
    assert torch.equal(torch.cat(list(read_frames(path, batch_size=1))), decoded)


def test_read_frames_numpy_source_for_write_clip(tmp_path):
    pytest.importorskip("av")
    frames = smooth_frames(4, 48, 64).numpy()  # numpy frames as well as tensors
    path = str(tmp_path / "np.mp4")
    write_clip(path, frames, fps=25)
    decoded = torch.cat(list(read_frames(path)))
    assert decoded.shape == (4, 48, 64, 3)
    assert mae(decoded, torch.from_numpy(frames)) < 8


def test_read_frames_bgr(clip):
    path, _ = clip
    rgb = torch.cat(list(read_frames(path, batch_size=4)))
    bgr = torch.cat(list(read_frames(path, batch_size=4, channels="bgr")))
    assert bgr.shape == rgb.shape
    assert (bgr.int() - rgb.flip(-1).int()).abs().max() <= 1
    assert not torch.equal(bgr, rgb)


@pytest.mark.parametrize(
    "max_frames, sizes", [(3, [3]), (4, [4]), (6, [4, 2]), (10, [4, 4, 2]), (50, [4, 4, 2])]
)
def test_read_frames_max_frames(clip, max_frames, sizes):
    path, _ = clip
    every = torch.cat(list(read_frames(path, batch_size=4)))
    batches = list(read_frames(path, batch_size=4, max_frames=max_frames))
    assert [b.shape[0] for b in batches] == sizes
    assert torch.equal(torch.cat(batches), every[: sum(sizes)])


def test_read_frames_max_frames_zero(clip):
    path, _ = clip
    assert sum(b.shape[0] for b in read_frames(path, max_frames=0)) == 0


def test_read_frames_errors(clip, tmp_path):
    path, _ = clip
    with pytest.raises(OSError):
        list(read_frames(str(tmp_path / "missing.mp4")))
    text = tmp_path / "text.mp4"
    text.write_text("not a video")
    with pytest.raises(ValueError):  # PyAV's InvalidDataError is a ValueError
        list(read_frames(str(text)))
    with pytest.raises(ValueError, match="channels must be 'rgb' or 'bgr'"):
        list(read_frames(path, channels="gray"))
    with pytest.raises(ValueError, match="batch_size must be positive"):
        list(read_frames(path, batch_size=0))
    # The wrong Python type: TypeError.
    with pytest.raises(TypeError, match=r"batch_size must be positive, got 2\.0"):
        list(read_frames(path, batch_size=2.0))
    with pytest.raises(TypeError, match="channels must be 'rgb' or 'bgr', got 3"):
        list(read_frames(path, channels=3))


def test_read_frames_no_video_stream(tmp_path):
    av = pytest.importorskip("av")
    path = str(tmp_path / "audio.wav")
    with av.open(path, "w") as container:
        stream = container.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode()]:
            container.mux(packet)
    with pytest.raises(ValueError, match="has no video stream"):
        list(read_frames(path))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [{}, dict(size=64, letterbox=True)], ids=["convert", "letterbox"])
def test_frame_stream_of_read_frames(clip, device, kw):
    path, _ = clip
    decoded = torch.cat(list(read_frames(path, batch_size=4)))
    fs = FrameStream(read_frames(path, batch_size=3), batch_size=4, device=device, **kw)
    assert fs.total is None
    batches = list(fs)
    assert [len(b.indices) for b in batches] == [4, 4, 2]
    check_stream(batches, list(decoded), 4, kw, device)
    assert fs.frames_delivered == 10
