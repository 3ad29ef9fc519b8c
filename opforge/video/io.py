"""Reading video files into uint8 NHWC batches (PyAV: ``pip install opforge[video]``)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch


def _av():
    try:
        import av
    except ImportError as e:  # an optional dependency
        raise ImportError(
            "opforge.video.read_frames needs PyAV: pip install 'opforge[video]' (or: pip install av)"
        ) from e
    return av


def read_frames(
    path: str,
    *,
    batch_size: int = 8,
    channels: str = "rgb",
    max_frames: int | None = None,
    threads: int = 0,
) -> Iterator[torch.Tensor]:
    """Decode the first video stream of ``path`` and yield uint8 ``(n, H, W, 3)`` CPU tensors of
    ``batch_size`` frames (the last batch may be shorter). ``channels`` is ``"rgb"`` or ``"bgr"``
    (the frames' channel order). ``threads``: decoder threads (0 = FFmpeg's choice). Frame-level
    threading of the decoder is on, so decoding runs beside the caller's work. ``max_frames``
    stops early. Decoding goes straight into each batch's buffer (no per-frame copies kept)."""
    # The wrong type (a str for an int, an int for a str): TypeError; a value out of range: ValueError.
    if not isinstance(channels, str) or channels not in ("rgb", "bgr"):
        err = ValueError if isinstance(channels, str) else TypeError
        raise err(f"opforge.video.read_frames: channels must be 'rgb' or 'bgr', got {channels!r}")
    if not isinstance(batch_size, int) or batch_size <= 0:
        err = ValueError if isinstance(batch_size, int) else TypeError
        raise err(f"opforge.video.read_frames: batch_size must be positive, got {batch_size!r}")
    if max_frames is not None and max_frames < 0:
        raise ValueError(f"opforge.video.read_frames: max_frames must be >= 0, got {max_frames}")
    av = _av()
    return _decode(av, path, batch_size, channels, max_frames, threads)


def _decode(av, path: str, batch_size: int, channels: str, max_frames: int | None, threads: int):
    if max_frames == 0:
        return
    fmt = "rgb24" if channels == "rgb" else "bgr24"
    with av.open(path) as container:
        if not container.streams.video:
            raise ValueError(f"opforge.video.read_frames: {path!r} has no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        if threads:
            stream.thread_count = threads
        batch: np.ndarray | None = None
        filled = 0
        count = 0
        for frame in container.decode(stream):
            image = frame.to_ndarray(format=fmt)
            if batch is None or batch.shape[1:] != image.shape:
                if batch is not None and filled:
                    yield torch.from_numpy(batch[:filled])
                batch, filled = np.empty((batch_size, *image.shape), dtype=np.uint8), 0
            batch[filled] = image
            filled += 1
            count += 1
            if filled == batch_size:
                yield torch.from_numpy(batch)
                batch, filled = None, 0
            if max_frames is not None and count >= max_frames:
                break
        if batch is not None and filled:
            yield torch.from_numpy(batch[:filled])


def write_clip(
    path: str, frames: np.ndarray | torch.Tensor, *, fps: int = 30, codec: str = "libx264"
) -> None:
    """Encode uint8 RGB frames ``(N, H, W, 3)`` into a video file with PyAV (tests, the demo's
    generated clip). Even sizes keep yuv420p encoders happy."""
    av = _av()
    frames = frames.numpy() if isinstance(frames, torch.Tensor) else np.asarray(frames)
    with av.open(path, mode="w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = int(frames.shape[2]), int(frames.shape[1])
        stream.pix_fmt = "yuv420p"
        for image in frames:
            for packet in stream.encode(
                av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            ):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
