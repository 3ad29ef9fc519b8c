"""opforge.video.FrameStream on a CUDA device: the direct (pinned / on-device) and the ring
(pageable) paths, slow consumers, side streams, back-pressure."""

from __future__ import annotations

import itertools
import time

import pytest
import torch
from conftest import wait_stagers_gone
from video_cases import check_raw, check_stream, expected_chunks, indices_of, rand

import opforge
from opforge import reference
from opforge.video import FrameStream

# --- CUDA: the direct (pinned / on-device) and ring (pageable) paths ------------------------------

SLEEP_CYCLES = 5_000_000  # a few milliseconds of GPU time


def cuda_items(kind: str, frames: torch.Tensor, B: int) -> list:
    """frames (CPU) as a source of the given kind."""
    n = frames.shape[0]
    if kind == "numpy frames":  # pageable single frames: the ring path
        return [f.numpy() for f in frames]
    if kind == "pageable batches":
        return [frames[s : s + B].clone() for s in range(0, n, B)]
    if kind == "pinned batches":  # batch_size pinned frames: the direct path (last one short: packed)
        return [frames[s : s + B].pin_memory() for s in range(0, n, B)]
    if kind == "pinned odd batches":  # pinned, of other sizes: packed through the ring
        sizes = itertools.cycle([3, B, 1, B + 2, B])
        items, s = [], 0
        while s < n:
            k = next(sizes)
            items.append(frames[s : s + k].pin_memory())
            s += k
        return items
    if kind == "cuda batches":
        return [frames[s : s + B].cuda() for s in range(0, n, B)]
    raise AssertionError(kind)


CUDA_KINDS = ["numpy frames", "pageable batches", "pinned batches", "pinned odd batches", "cuda batches"]


@pytest.mark.cuda
@pytest.mark.parametrize("kind", CUDA_KINDS)
def test_cuda_matches_cpu(kind):
    B = 4
    frames = rand(4 * 6 + 3, 36, 52)
    kw = dict(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    fs = FrameStream(cuda_items(kind, frames, B), batch_size=B, device="cuda", **kw)
    batches = list(fs)
    torch.cuda.synchronize()
    check_stream(batches, list(frames), B, kw, "cuda")
    for b in batches:
        want = reference.preprocess_frames(torch.stack([frames[i] for i in b.indices]), **kw)
        assert torch.equal(b.frames.cpu(), want)


@pytest.mark.cuda
def test_cuda_direct_path_packs_nothing():
    """Pinned batches of batch_size frames and frames on the GPU are not packed by the stager."""
    B = 4
    frames = rand(4 * 5, 24, 40)
    for kind in ("pinned batches", "cuda batches"):
        fs = FrameStream(cuda_items(kind, frames, B), batch_size=B, device="cuda")
        check_stream(list(fs), list(frames), B, {}, "cuda")
        assert fs.stats()["stage_s"] == 0.0
    fs = FrameStream(cuda_items("numpy frames", frames, B), batch_size=B, device="cuda")
    check_stream(list(fs), list(frames), B, {}, "cuda")
    assert fs.stats()["stage_s"] > 0.0


@pytest.mark.cuda
def test_cuda_frames_on_gpu_in_place():
    B = 4
    src = [rand(B, 24, 40).cuda() for _ in range(3)]
    raw = list(FrameStream(src, batch_size=B, device="cuda", raw=True))
    assert [b.frames.data_ptr() for b in raw] == [s.data_ptr() for s in src]  # the source's own memory
    kw = dict(size=32, letterbox=True)
    batches = list(FrameStream(src, batch_size=B, device="cuda", **kw))
    for b, s in zip(batches, src, strict=True):
        want, info = opforge.preprocess_frames(s, **kw)
        assert b.info == info and torch.equal(b.frames, want)
    # GPU frames of other sizes than batch_size are delivered too, in order.
    frames = rand(11, 24, 40)
    items = [frames[:3].cuda(), frames[3:4].cuda(), frames[4:9].cuda(), frames[9:].cuda()]
    check_stream(list(FrameStream(items, batch_size=B, device="cuda")), list(frames), B, {}, "cuda")


@pytest.mark.cuda
def test_cuda_model_sum():
    B = 4
    frames = rand(10, 16, 24)
    items = [f.numpy() for f in frames]
    batches = list(
        FrameStream(items, batch_size=B, device="cuda", model=lambda x: x.sum(), out_dtype=torch.float32)
    )
    assert indices_of(batches) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    for b in batches:
        want = reference.preprocess_frames(
            torch.stack([frames[i] for i in b.indices]), out_dtype=torch.float32
        )
        assert b.output.device.type == "cuda" and b.output.dim() == 0
        assert torch.equal(b.frames.cpu(), want)
        torch.testing.assert_close(b.output.cpu(), want.sum(), rtol=1e-4, atol=1e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("raw", [False, True], ids=["preprocessed", "raw"])
@pytest.mark.parametrize("kind", CUDA_KINDS[:4])
def test_cuda_ring_2_slow_consumer(kind, raw):
    """Many batches through 2 ring slots while the consumer's stream lags: every batch kept and
    compared at the end (a slot refilled before its batch was read would show)."""
    B = 4
    frames = rand(4 * 30 + 3, 36, 52)
    kept = []
    for b in FrameStream(cuda_items(kind, frames, B), batch_size=B, device="cuda", ring=2, raw=raw):
        torch.cuda._sleep(SLEEP_CYCLES)
        kept.append(b)
    torch.cuda.synchronize()
    if raw:
        check_raw(kept, list(frames), B, "cuda")
    else:
        check_stream(kept, list(frames), B, {}, "cuda")


@pytest.mark.cuda
def test_cuda_ring_2_size_changes():
    """Ring buffers reallocated for new frame sizes, while the consumer lags."""
    B = 4
    items, frames = [], []
    shapes = itertools.cycle([(24, 40, 3), (30, 20, 3), (24, 40, 4)])
    for k in range(12):
        chunk = rand(5 + k % 4, *next(shapes))
        items.extend(f.numpy() for f in chunk)
        frames.extend(chunk)
    kept = []
    for b in FrameStream(items, batch_size=B, device="cuda", ring=2):
        torch.cuda._sleep(SLEEP_CYCLES)
        kept.append(b)
    torch.cuda.synchronize()
    check_stream(kept, frames, B, {}, "cuda")


@pytest.mark.cuda
def test_cuda_pinned_source_not_kept():
    """Pinned batches made by the source and dropped after use: their memory stays valid for the
    copy (the caching host allocator holds it until the transfer ends)."""
    B = 4
    frames = rand(4 * 20, 36, 52)

    def source():
        for s in range(0, frames.shape[0], B):
            yield frames[s : s + B].pin_memory()  # only the pipeline refers to it

    kept = []
    for b in FrameStream(source(), batch_size=B, device="cuda", ring=2):
        torch.cuda._sleep(SLEEP_CYCLES)
        kept.append(b)
    torch.cuda.synchronize()
    check_stream(kept, list(frames), B, {}, "cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["numpy frames", "pinned batches"])
def test_cuda_side_stream_consumer(kind):
    """Batches are ready on the caller's current stream (a side stream here), big enough for
    the copies to take time."""
    B = 4
    frames = rand(4 * 6, 360, 640)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
        batches, copies = [], []
        for b in FrameStream(cuda_items(kind, frames, B), batch_size=B, device="cuda", ring=2):
            copies.append(b.frames.clone())  # read on s at once
            batches.append(b)
        got = [t.cpu() for t in copies]  # copied on s
    assert indices_of(batches) == expected_chunks(list(frames), B)
    for t, b in zip(got, batches, strict=True):
        want = reference.preprocess_frames(torch.stack([frames[i] for i in b.indices]))
        assert torch.equal(t, want)


@pytest.mark.cuda
@pytest.mark.parametrize("ring", [2, 3])
def test_cuda_back_pressure_pinned(ring):
    """The direct path (pinned batches) is bounded too: ring batches in the ready queue, one more
    item waiting to be queued."""
    B = 4
    n = 30
    frames = rand(n * B, 8, 12)
    items = [frames[s : s + B].pin_memory() for s in range(0, n * B, B)]
    pulled = []

    def source():
        for item in items:
            pulled.append(1)
            yield item

    it = iter(FrameStream(source(), batch_size=B, device="cuda", ring=ring))
    first = next(it)
    time.sleep(0.3)
    count = len(pulled)
    assert ring + 1 <= count <= ring + 2, count
    batches = [first, *it]
    check_stream(batches, list(frames), B, {}, "cuda")


@pytest.mark.cuda
def test_cuda_source_exception_and_close():
    class CameraError(Exception):
        pass

    frames = rand(10, 16, 24).pin_memory()

    def camera():
        yield frames[:4]
        yield frames[4:8]
        raise CameraError("lost")

    got = []
    with pytest.raises(CameraError):
        for b in FrameStream(camera(), batch_size=4, device="cuda"):
            got.append(b)
    check_stream(got, list(frames[:8]), 4, {}, "cuda")
    assert wait_stagers_gone() == []
