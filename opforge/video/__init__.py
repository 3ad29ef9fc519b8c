"""opforge.video: the real-time video path. :func:`opforge.preprocess_frames` (one fused pass per
frame), :class:`FrameStream` (host frames to GPU batches with copies overlapping compute),
:func:`read_frames` (video files through PyAV), :func:`scale_boxes` (boxes back to the frame)."""

from opforge.ops.preprocess_frames import FrameInfo, letterbox_geometry, preprocess_frames
from opforge.video.boxes import scale_boxes
from opforge.video.io import read_frames, write_clip
from opforge.video.stream import FrameStream, StreamBatch

__all__ = [
    "FrameInfo",
    "FrameStream",
    "StreamBatch",
    "letterbox_geometry",
    "preprocess_frames",
    "read_frames",
    "scale_boxes",
    "write_clip",
]
