"""FrameStream: host frames to preprocessed GPU batches, with the copies overlapping the compute.

Pipeline, per batch (``ring`` batches in flight at most):

    stager thread            copy stream                  compute stream (the caller's)
    -------------            -----------                  -----------------------------
    frames -> pinned slot k  wait slot k free (event)     wait copy k (event)
                             H2D pinned k -> device k     preprocess_frames(device k) ; free k (event)
                             record "copied k"            model(batch) -> yielded to the caller

The stager thread packs the source's frames into a ring of pinned buffers (a parallel memcpy;
PyTorch releases the GIL) and enqueues each buffer's transfer on a copy stream; the caller's
thread preprocesses the batch before it on its current stream and runs the model, while the next
transfers run. CUDA events order the streams; no call waits for the GPU except the stager's wait
for a pinned slot's previous transfer before refilling it.
"""

from __future__ import annotations

import contextlib
import inspect
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

from opforge.ops.copy_async import copy_async
from opforge.ops.preprocess_frames import FrameInfo, preprocess_frames

_POLL_S = 0.05  # how often blocked threads look for a stop request
FS = "opforge.video.FrameStream"
# preprocess_frames' keyword arguments (all but the frames).
_PREPROCESS_ARGS = tuple(inspect.signature(preprocess_frames).parameters)[1:]


class StreamBatch(NamedTuple):
    """One batch of a :class:`FrameStream`."""

    frames: torch.Tensor
    """Preprocessed ``(n, 3, h, w)`` on the stream's device (ready on the caller's current stream)."""
    info: FrameInfo
    """Where the frames landed in ``frames`` (letterbox pads and ratio): :func:`scale_boxes` takes it."""
    indices: range
    """The frames' positions in the source (0-based, in order)."""
    output: Any = None
    """``model(frames)`` when a model was given, else None."""


class _Item(NamedTuple):
    slot: int  # ring slot, or -1 for frames that need no staging (already on the device / pinned batch)
    raw: torch.Tensor  # uint8 (n, H, W, C) on the device (or CPU for the CPU path)
    first: int
    count: int
    copied: torch.cuda.Event | None
    keep: Any  # the source's tensor, kept alive until the batch is consumed


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_frames(item: Any) -> torch.Tensor:
    """A source item as a uint8 (n, H, W, C) tensor, without copying."""
    if isinstance(item, np.ndarray):
        if not item.flags.writeable or any(st < 0 for st in item.strides):
            item = item.copy()  # a flipped view (frame[..., ::-1]) or a read-only buffer: one copy
        t = torch.from_numpy(item)
    elif isinstance(item, torch.Tensor):
        t = item
    else:
        raise TypeError(f"{FS}: the source must yield numpy arrays or tensors, got {type(item).__name__}")
    # Frames whose dtype or shape do not fit: RuntimeError, as preprocess_frames (and PyTorch's own
    # ops) raise for tensors; an item that is no array at all: TypeError.
    if t.dtype != torch.uint8:
        raise RuntimeError(f"{FS}: frames must be uint8, got {t.dtype}")
    if t.dim() == 3:
        t = t.unsqueeze(0)
    if t.dim() != 4 or t.shape[3] not in (3, 4):
        raise RuntimeError(
            f"{FS}: frames must be (H, W, C) or (N, H, W, C) with C = 3 or 4, got {list(t.shape)}"
        )
    return t


class _Pipeline:
    """The state of one iteration over a FrameStream: its thread, queues and buffers."""

    def __init__(self, source: Iterable, batch_size: int, device: torch.device, ring: int):
        self.source = source
        self.batch_size = batch_size
        self.device = device
        self.cuda = device.type == "cuda"
        self.ring = ring
        self.stop = threading.Event()
        self.free: queue.Queue[int] = queue.Queue()
        for k in range(ring):
            self.free.put(k)
        self.ready: queue.Queue[Any] = queue.Queue(maxsize=ring)
        self.host: list[torch.Tensor | None] = [None] * ring
        self.dev: list[torch.Tensor | None] = [None] * ring
        self.copied = [torch.cuda.Event() for _ in range(ring)] if self.cuda else [None] * ring
        self.consumed = [torch.cuda.Event() for _ in range(ring)] if self.cuda else [None] * ring
        self.used = [False] * ring  # the slot held a batch before (on CUDA: its consumed event is recorded)
        self.copy_stream = torch.cuda.Stream(device) if self.cuda else None
        self.stage_s = 0.0  # time the stager spent packing frames (host memcpy)
        self.wait_s = 0.0  # time the caller waited for a batch
        self.slot_wait_s = 0.0  # time the stager waited for a ring slot (its last transfer, or the caller)
        self.in_source = False  # the stager is inside the source (iter() or next()), touching no buffer
        self.thread = threading.Thread(target=self._stage, name="opforge-framestream", daemon=True)
        self.thread.start()

    # -- stager thread ----------------------------------------------------------------------
    def _put(self, value: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.ready.put(value, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _take_slot(self) -> int | None:
        while not self.stop.is_set():
            try:
                return self.free.get(timeout=_POLL_S)
            except queue.Empty:
                continue
        return None

    def _buffers(self, k: int, shape: tuple[int, ...]) -> None:
        full = (self.batch_size, *shape)
        host = self.host[k]
        if host is None or tuple(host.shape) != full:
            self.host[k] = torch.empty(full, dtype=torch.uint8, pin_memory=self.cuda)
            if self.cuda:
                # On this thread's (the device's default) stream, whose cached blocks the next
                # FrameStream reuses; the copy and compute streams that use it are recorded.
                self.dev[k] = torch.empty(full, dtype=torch.uint8, device=self.device)
                # (A cached block's last user ran on that stream: the copy stream comes after it.)
                self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))

    def _send(self, k: int, count: int, first: int) -> bool:
        dev = self.dev[k] if self.cuda else self.host[k]
        if self.cuda:
            with torch.cuda.stream(self.copy_stream):
                if self.used[k]:
                    self.copy_stream.wait_event(self.consumed[k])  # device slot k read by then
                copy_async(dev[:count], self.host[k][:count])
                self.copied[k].record(self.copy_stream)
        return self._put(_Item(k, dev[:count], first, count, self.copied[k], None))

    def _send_pinned(self, frames: torch.Tensor, first: int) -> bool:
        """A whole pinned batch: no packing, one transfer."""
        event = torch.cuda.Event()
        dev = torch.empty(frames.shape, dtype=torch.uint8, device=self.device)
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.copy_stream):
            copy_async(dev, frames)
            event.record(self.copy_stream)
        return self._put(_Item(-1, dev, first, frames.shape[0], event, frames))

    def _send_gpu(self, parts: list[torch.Tensor], first: int) -> bool:
        """Frames already on the GPU: a batch that is one source tensor is read in place; pieces of
        several are joined on the GPU (ordered before the consumer by an event)."""
        if len(parts) == 1:
            return self._put(_Item(-1, parts[0], first, parts[0].shape[0], None, parts[0]))
        joined = torch.cat(parts)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(joined.device))
        return self._put(_Item(-1, joined, first, joined.shape[0], event, None))

    def _items(self) -> Iterator[Any]:
        """The source's items; ``in_source`` is set while the source runs (its iter() or next()):
        close() does not wait for a source blocked there."""
        it = None
        while True:
            self.in_source = True
            try:
                it = iter(self.source) if it is None else it
                item = next(it)
            except StopIteration:
                return
            finally:
                self.in_source = False
            yield item

    def _stage(self) -> None:
        try:
            first = 0  # index of the next frame to deliver
            k, filled, shape = None, 0, None  # the ring slot being packed from host frames
            gpu: list[torch.Tensor] = []  # GPU frames gathered for the next batch
            gpu_count = 0
            for item in self._items():
                if self.stop.is_set():
                    return
                frames = _as_frames(item)
                if frames.shape[0] == 0:
                    continue
                on_gpu = self.cuda and frames.device.type == "cuda"
                # A change of frame size, or between host and GPU frames, ends a batch early.
                if gpu and (not on_gpu or tuple(frames.shape[1:]) != tuple(gpu[0].shape[1:])):
                    if not self._send_gpu(gpu, first):
                        return
                    first, gpu, gpu_count = first + gpu_count, [], 0
                if k is not None and (on_gpu or tuple(frames.shape[1:]) != shape):
                    if not self._send(k, filled, first):
                        return
                    first, k = first + filled, None
                if on_gpu:
                    pos = 0
                    while pos < frames.shape[0]:
                        take = min(self.batch_size - gpu_count, frames.shape[0] - pos)
                        gpu.append(frames[pos : pos + take])
                        gpu_count += take
                        pos += take
                        if gpu_count == self.batch_size:
                            if not self._send_gpu(gpu, first):
                                return
                            first, gpu, gpu_count = first + gpu_count, [], 0
                    continue
                if self.cuda and k is None and frames.shape[0] == self.batch_size and frames.is_pinned():
                    if not self._send_pinned(frames, first):
                        return
                    first += frames.shape[0]
                    continue
                if frames.device.type == "cuda":  # a CPU stream of GPU frames
                    frames = frames.cpu()
                pos = 0
                while pos < frames.shape[0]:
                    if k is None:
                        t0 = time.perf_counter()
                        k = self._take_slot()
                        if k is None:
                            return
                        shape, filled = tuple(frames.shape[1:]), 0
                        self._buffers(k, shape)
                        if self.cuda and self.used[k]:
                            self.copied[k].synchronize()  # pinned slot k's last transfer is done
                        self.slot_wait_s += time.perf_counter() - t0
                    take = min(self.batch_size - filled, frames.shape[0] - pos)
                    t0 = time.perf_counter()
                    copy_async(self.host[k][filled : filled + take], frames[pos : pos + take])
                    self.stage_s += time.perf_counter() - t0
                    filled += take
                    pos += take
                    if filled == self.batch_size:
                        if not self._send(k, filled, first):
                            return
                        first, k = first + filled, None
            if gpu and not self._send_gpu(gpu, first):
                return
            if k is not None and filled and not self._send(k, filled, first):
                return
            self._put(StopIteration())
        except BaseException as e:  # surfaces in the caller's thread
            self._put(e)

    # -- caller's thread ---------------------------------------------------------------------
    def next_item(self) -> _Item | None:
        t0 = time.perf_counter()
        while True:
            if self.stop.is_set():  # closed from outside (close(), the with block): the pass ends
                return None
            try:
                value = self.ready.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self.thread.is_alive() and self.ready.empty():
                    raise RuntimeError(f"{FS}: the staging thread ended unexpectedly") from None
        self.wait_s += time.perf_counter() - t0
        if isinstance(value, StopIteration):
            return None
        if isinstance(value, BaseException):
            raise value
        return value

    def release(self, item: _Item, stream: torch.cuda.Stream | None) -> None:
        if item.slot < 0:
            return
        if self.cuda:
            self.consumed[item.slot].record(stream)
        self.used[item.slot] = True
        self.free.put(item.slot)

    def close(self) -> None:
        self.stop.set()
        # The stager stops at its next step. A source blocked in its own next() (a stalled camera)
        # is not waited for: the daemon thread is abandoned to it and, when next() returns, sees the
        # stop and exits without touching a buffer.
        while self.thread.is_alive() and not self.in_source:
            self.thread.join(timeout=_POLL_S)
        # In-flight transfers read the pinned slots: wait for them before the buffers go.
        if self.cuda:
            self.copy_stream.synchronize()
        self.host = [None] * self.ring
        self.dev = [None] * self.ring
        while not self.ready.empty():
            self.ready.get_nowait()


class FrameStream:
    """Stream host frames to the GPU in preprocessed batches, copies overlapping compute.

    Args:
        source: any iterable of uint8 frames: numpy arrays or tensors, single frames ``(H, W, C)``
            or batches ``(N, H, W, C)`` (C = 3 or 4), e.g. :func:`read_frames`, a camera loop or a
            list. Pinned batches of ``batch_size`` frames are sent as they are (no packing); frames
            already on the GPU never leave it: a GPU tensor of ``batch_size`` frames is
            preprocessed in place, smaller ones are joined on the GPU.
        batch_size: frames per yielded batch (a change of frame size, or between host and GPU
            frames, ends a batch early; the last batch may be short).
        device: where batches go; None = the current CUDA device, or the CPU without one.
        model: optional callable applied to each preprocessed batch on the compute stream; its
            result is the batch's ``output``.
        ring: batches in flight (pinned + device buffers of ``batch_size`` frames each, allocated
            once per frame size). Bounds memory: while the caller holds a batch, the source has been
            read at most ``ring`` batches (and one frame) beyond it; a slow consumer stalls the
            source (back-pressure), never grows memory.
        raw: yield the uint8 ``(n, H, W, C)`` device batches as they arrive, not preprocessed
            (``info`` is then None): for callers that run the preprocessing themselves, inside a
            CUDA graph say (``opforge demo detect --graph``).
        **preprocess_kwargs: passed to :func:`opforge.preprocess_frames` (size, letterbox, mean,
            std, out_dtype, channels_in, ...).

    Iterating yields :class:`StreamBatch` ``(frames, info, indices, output)`` in source order,
    every frame exactly once. Batches are ready on the caller's current stream (no host sync).
    An exception in the source or the model surfaces in the caller; closing (``with``, ``close()``,
    ``break``, or dropping the iterator) stops the staging thread and frees the buffers, and
    returns promptly: a source blocked in its own ``next()`` (a stalled camera) is abandoned, not
    waited for (the daemon thread ends when that ``next()`` returns, its item dropped). Every
    argument is checked by the constructor (the preprocessing ones too).
    ``frames_delivered``, ``fps``, ``elapsed_s`` and :meth:`stats` report progress.
    """

    def __init__(
        self,
        source: Iterable,
        *,
        batch_size: int = 8,
        device: torch.device | str | None = None,
        model: Callable[[torch.Tensor], Any] | None = None,
        ring: int = 3,
        raw: bool = False,
        **preprocess_kwargs: Any,
    ):
        # Every argument is checked here, not in the staging thread (bools are not ints).
        if not isinstance(source, Iterable):
            raise TypeError(f"{FS}: source must be an iterable of frames, got {type(source).__name__}")
        # A value of the wrong type (2.0, True) is a TypeError, an int out of range a ValueError.
        if not _is_int(batch_size) or batch_size <= 0:
            err = ValueError if _is_int(batch_size) else TypeError
            raise err(f"{FS}: batch_size must be a positive int, got {batch_size!r}")
        if not _is_int(ring) or ring < 2:
            err = ValueError if _is_int(ring) else TypeError
            raise err(f"{FS}: ring must be an int >= 2, got {ring!r}")
        if model is not None and not callable(model):
            raise TypeError(f"{FS}: model must be callable or None, got {type(model).__name__}")
        if not isinstance(raw, bool):
            raise TypeError(f"{FS}: raw must be a bool, got {raw!r}")
        if device is not None and not isinstance(device, (str, torch.device)):
            raise TypeError(f"{FS}: device must be a torch.device, a string or None, got {device!r}")
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        try:
            device = torch.device(device)
        except RuntimeError:
            raise ValueError(f"{FS}: device must be a CUDA device or the CPU, got {device!r}") from None
        if device.type not in ("cuda", "cpu"):
            raise ValueError(f"{FS}: device must be a CUDA device or the CPU, got {device}")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"{FS}: device {device} needs CUDA, which is not available")
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        unknown = sorted(set(preprocess_kwargs) - set(_PREPROCESS_ARGS))
        if unknown:
            raise TypeError(
                f"{FS}: unknown preprocessing argument(s) {unknown}; preprocess_frames takes {list(_PREPROCESS_ARGS)}"
            )
        if raw and preprocess_kwargs:
            raise ValueError(f"{FS}: raw=True takes no preprocessing arguments")
        if not raw:  # the preprocessing arguments' own checks, on an empty batch of meta frames
            preprocess_frames(
                torch.empty((0, 3, 3, 3), dtype=torch.uint8, device="meta"), **preprocess_kwargs
            )
        self.source = source
        self.batch_size = batch_size
        self.device = device
        self.model = model
        self.ring = ring
        self.preprocess_kwargs = preprocess_kwargs
        self.raw = raw
        self.total = _count_frames(source)
        self.frames_delivered = 0
        self.batches_delivered = 0
        self._start: float | None = None
        self._end: float | None = None
        self._pipeline: _Pipeline | None = None
        self._stage_s = self._wait_s = self._slot_wait_s = 0.0
        self._active: object | None = None  # the claim of the pass under way

    def __iter__(self) -> Iterator[StreamBatch]:
        if self._active is not None:
            raise RuntimeError(f"{FS}: already being iterated (one pass at a time)")
        token = self._active = object()
        gen = self._run(token)
        # An iterator dropped before its first next() never runs _run's finally: release its claim
        # then (only its own: a later pass may hold the stream by the time it is collected).
        weakref.finalize(gen, self._release, token)
        return gen

    def _release(self, token: object) -> None:
        if self._active is token:
            self._active = None

    def _run(self, token: object) -> Iterator[StreamBatch]:
        pipe = _Pipeline(self.source, self.batch_size, self.device, self.ring)
        self._pipeline = pipe
        self.frames_delivered = self.batches_delivered = 0
        self._start, self._end = time.perf_counter(), None
        stream = torch.cuda.current_stream(self.device) if pipe.cuda else None
        letterbox = bool(self.preprocess_kwargs.get("letterbox", False))
        try:
            while True:
                item = pipe.next_item()
                if item is None:
                    return
                if item.copied is not None:
                    stream.wait_event(item.copied)
                if pipe.cuda:
                    item.raw.record_stream(stream)  # allocated on the copy stream, read on this one
                with torch.cuda.device(self.device) if pipe.cuda else contextlib.nullcontext():
                    if self.raw:
                        frames, info = item.raw, None
                        if item.slot >= 0:  # a ring buffer: the caller's copy, the slot goes back
                            frames = frames.clone()
                    else:
                        result = preprocess_frames(item.raw, **self.preprocess_kwargs)
                        frames, info = result if letterbox else (result, _plain_info(item.raw, result))
                    pipe.release(item, stream)
                    output = self.model(frames) if self.model is not None else None
                self.frames_delivered += item.count
                self.batches_delivered += 1
                yield StreamBatch(frames, info, range(item.first, item.first + item.count), output)
        finally:
            self._end = time.perf_counter()
            pipe.close()
            self._stage_s, self._wait_s, self._slot_wait_s = pipe.stage_s, pipe.wait_s, pipe.slot_wait_s
            self._pipeline = None
            self._release(token)

    def close(self) -> None:
        """Stop the staging thread and free the buffers (also done by ``with`` and at the end).

        Returns promptly: a source blocked in its own ``next()`` is abandoned to finish on its own
        (the daemon thread then ends, dropping the item, and reads nothing more from it)."""
        if self._pipeline is not None:
            self._pipeline.close()

    def __enter__(self) -> FrameStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def elapsed_s(self) -> float:
        if self._start is None:
            return 0.0
        return (self._end if self._end is not None else time.perf_counter()) - self._start

    @property
    def fps(self) -> float:
        """Frames delivered per second since iteration began (host time: batches handed out)."""
        elapsed = self.elapsed_s
        return self.frames_delivered / elapsed if elapsed > 0 else 0.0

    def stats(self) -> dict[str, float]:
        """frames, batches, elapsed_s, fps, and the seconds the stager spent packing frames
        (stage_s), the caller spent waiting for a batch (wait_s: the source or the copies are the
        bottleneck) and the stager spent waiting for a ring slot (slot_wait_s: the caller or the
        transfers are)."""
        pipe = self._pipeline
        return {
            "frames": self.frames_delivered,
            "batches": self.batches_delivered,
            "total": self.total,
            "elapsed_s": self.elapsed_s,
            "fps": self.fps,
            "stage_s": pipe.stage_s if pipe else self._stage_s,
            "wait_s": pipe.wait_s if pipe else self._wait_s,
            "slot_wait_s": pipe.slot_wait_s if pipe else self._slot_wait_s,
        }


def _count_frames(source: Iterable) -> int | None:
    """Frames in a list/tuple source (single frames and batches), else None (unknown)."""
    if not isinstance(source, (list, tuple)):
        return None
    total = 0
    for item in source:
        shape = getattr(item, "shape", None)
        if shape is None:
            return None
        total += int(shape[0]) if len(shape) == 4 else 1
    return total


def _plain_info(raw: torch.Tensor, out: torch.Tensor) -> FrameInfo:
    height, width = int(raw.shape[1]), int(raw.shape[2])
    out_h, out_w = int(out.shape[2]), int(out.shape[3])
    return FrameInfo((height, width), (out_h, out_w), (out_h, out_w), (0, 0), (out_h / height, out_w / width))
