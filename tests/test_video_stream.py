"""opforge.video.FrameStream on any device: order, values, batching, the model, errors in the
source, back-pressure, closing, one pass at a time, progress, bad input, raw batches."""

from __future__ import annotations

import gc
import itertools
import threading
import time

import numpy as np
import pytest
import torch
from conftest import DEVICES, stagers, wait_stagers_gone
from video_cases import check_raw, check_stream, indices_of, per_frame, rand

from opforge import reference
from opforge.video import FrameStream

# --- order, no loss, no duplicates, values --------------------------------------------------------


def _src_single_numpy():
    return [f.numpy() for f in rand(11, 24, 40)]


def _src_numpy_batches():
    return [rand(n, 24, 40).numpy() for n in (3, 8, 5, 1)]


def _src_tensor_batches():
    return [rand(n, 24, 40) for n in (3, 8, 5, 1)]


def _src_mixed():
    """Single frames and batches, numpy and tensors, an empty batch in the middle."""
    return [
        rand(1, 24, 40)[0].numpy(),
        rand(5, 24, 40),
        rand(2, 24, 40).numpy(),
        rand(1, 24, 40)[0],
        rand(0, 24, 40).numpy(),
        rand(3, 24, 40),
        rand(1, 24, 40).numpy(),
    ]


def _src_four_channels():
    return [rand(3, 24, 40, 4), rand(1, 24, 40, 4)[0].numpy(), rand(6, 24, 40, 4).numpy()]


def _src_size_change():
    """Frame size and channel changes mid-stream (each ends a batch early)."""
    return [
        rand(3, 24, 40),
        rand(1, 24, 40)[0].numpy(),
        rand(2, 16, 30).numpy(),
        rand(6, 16, 30),
        rand(1, 16, 30)[0].numpy(),
        rand(2, 24, 40),
        rand(1, 24, 40, 4),
        rand(5, 24, 40, 4).numpy(),
        rand(1, 24, 40)[0].numpy(),
    ]


def _src_strided():
    """Non-contiguous views (a crop, NCHW storage seen as NHWC, a column step) and read-only numpy."""
    ro = rand(2, 24, 40).numpy()
    ro.setflags(write=False)
    return [
        rand(4, 40, 60)[:, 5:29, 7:47],
        rand(3, 3, 24, 40).permute(0, 2, 3, 1),
        rand(6, 24, 80).numpy()[:, :, ::2],
        ro,
        rand(1, 30, 50)[0, 3:27, 5:45].numpy(),
    ]


SOURCES = {
    "single numpy frames": _src_single_numpy,
    "numpy batches 3 8 5 1": _src_numpy_batches,
    "tensor batches 3 8 5 1": _src_tensor_batches,
    "mixed": _src_mixed,
    "generator": _src_mixed,
    "4 channels": _src_four_channels,
    "size change": _src_size_change,
    "size change generator": _src_size_change,
    "strided": _src_strided,
}

KWARGS = {
    "default": {},
    "imagenet bgr float32": dict(
        mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], out_dtype=torch.float32, channels_in="bgr"
    ),
    "letterbox 32": dict(size=32, letterbox=True),
    "letterbox stride": dict(size=48, letterbox=True, stride=16, pad_value=0, out_dtype=torch.bfloat16),
    "resize": dict(size=(20, 28)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", list(KWARGS.values()), ids=list(KWARGS))
@pytest.mark.parametrize("source", list(SOURCES))
def test_order_and_values(device, kw, source):
    items = SOURCES[source]()
    frames = per_frame(items)
    src = (x for x in items) if "generator" in source else items
    fs = FrameStream(src, batch_size=4, device=device, **kw)
    batches = list(fs)
    check_stream(batches, frames, 4, kw, device)
    assert fs.frames_delivered == len(frames)
    assert fs.batches_delivered == len(batches)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_batch_size_respected(device, batch_size):
    items = [
        rand(5, 12, 20),
        rand(1, 12, 20)[0].numpy(),
        rand(7, 12, 20).numpy(),
        rand(2, 10, 20),
        rand(4, 12, 20),
    ]
    frames = per_frame(items)
    batches = list(FrameStream(items, batch_size=batch_size, device=device))
    check_stream(batches, frames, batch_size, {}, device)
    # Full batches except the last one before a size change and the very last one.
    for b, nxt in itertools.pairwise(batches):
        if frames[b.indices[0]].shape == frames[nxt.indices[0]].shape:
            assert len(b.indices) == batch_size
    assert all(0 < len(b.indices) <= batch_size for b in batches)


@pytest.mark.parametrize("device", DEVICES)
def test_large_item_split_across_batches(device):
    """A source batch larger than batch_size, and frames carried over between source batches."""
    items = [rand(11, 8, 12), rand(2, 8, 12).numpy(), rand(9, 8, 12)]
    frames = per_frame(items)
    batches = list(FrameStream(items, batch_size=4, ring=2, device=device))
    assert [len(b.indices) for b in batches] == [4, 4, 4, 4, 4, 2]
    check_stream(batches, frames, 4, {}, device)


@pytest.mark.parametrize("device", DEVICES)
def test_default_device(device):
    """device=None: the current CUDA device, or the CPU without one."""
    items = [f.numpy() for f in rand(5, 8, 12)]
    fs = FrameStream(items, batch_size=2)
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert fs.device.type == want
    check_stream(list(fs), per_frame(items), 2, {}, want)


# --- the model ------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_model_output(device):
    calls = []

    def model(x):
        calls.append(x)
        return x.float().sum(dim=(1, 2, 3))

    items = [f.numpy() for f in rand(10, 16, 24)]
    frames = per_frame(items)
    batches = list(FrameStream(items, batch_size=4, device=device, model=model, out_dtype=torch.float32))
    assert indices_of(batches) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert len(calls) == len(batches)
    for b, x in zip(batches, calls, strict=True):
        assert x is b.frames  # model(frames) of the batch it is yielded with
        raw = torch.stack([frames[i] for i in b.indices])
        want = reference.preprocess_frames(raw, out_dtype=torch.float32)
        assert torch.equal(b.frames.cpu(), want)
        assert b.output.device == b.frames.device
        assert torch.equal(b.output, b.frames.float().sum(dim=(1, 2, 3)))
        torch.testing.assert_close(b.output.cpu(), want.sum(dim=(1, 2, 3)), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_model_exception(device):
    class ModelError(Exception):
        pass

    seen = []

    def model(x):
        seen.append(x.shape[0])
        if len(seen) == 2:
            raise ModelError("the model failed on batch 1")
        return x.shape[0]

    items = [f.numpy() for f in rand(20, 8, 12)]
    fs = FrameStream(items, batch_size=4, device=device, model=model)
    got = []
    with pytest.raises(ModelError, match="failed on batch 1"):
        for b in fs:
            got.append(b)
    assert indices_of(got) == [[0, 1, 2, 3]]
    assert got[0].output == 4
    assert wait_stagers_gone() == []
    # Released: the stream can run again, from the start.
    fs.model = None
    check_stream(list(fs), per_frame(items), 4, {}, device)


# --- errors in the source -------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_source_exception(device):
    class CameraError(Exception):
        pass

    frames = rand(12, 8, 12)

    def camera():
        for i in range(12):
            if i == 7:
                raise CameraError("camera unplugged at frame 7")
            yield frames[i].numpy()

    fs = FrameStream(camera(), batch_size=3, device=device)
    got = []
    with pytest.raises(CameraError, match="unplugged at frame 7") as excinfo:
        for b in fs:
            got.append(b)
    assert excinfo.type is CameraError  # the original type, not a wrapper
    # The complete batches staged before the error came first, in order.
    assert indices_of(got) == [[0, 1, 2], [3, 4, 5]]
    check_stream(got, per_frame(frames[:6]), 3, {}, device)
    assert wait_stagers_gone() == []
    assert fs.frames_delivered == 6


@pytest.mark.parametrize("device", DEVICES)
def test_source_iter_exception(device):
    class NoCamera:
        def __iter__(self):
            raise OSError("no camera attached")

    with pytest.raises(OSError, match="no camera attached"):
        list(FrameStream(NoCamera(), batch_size=2, device=device))


# --- back-pressure and infinite sources -----------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ring", [2, 3])
@pytest.mark.parametrize("batched", [False, True], ids=["frames", "batches"])
def test_back_pressure(device, ring, batched):
    """A consumer holding one batch: the stager fills the ring (ring batches in the ready queue,
    every slot in use) and then holds at most one more source item while it waits for a slot."""
    B = 4
    n = 40 * B
    frames = rand(n, 8, 12)
    pulled = []

    def source():
        if batched:
            for s in range(0, n, B):
                pulled.append(B)
                yield frames[s : s + B].numpy()
        else:
            for i in range(n):
                pulled.append(1)
                yield frames[i].numpy()

    fs = FrameStream(source(), batch_size=B, device=device, ring=ring)
    it = iter(fs)
    first = next(it)
    time.sleep(0.3)  # the consumer is busy
    count = sum(pulled)
    # The delivered batch, ring staged batches, and one item waiting for a slot.
    bound = (ring + 2) * B if batched else (ring + 1) * B + 1
    assert (ring + 1) * B <= count <= bound, (count, bound)
    time.sleep(0.1)
    assert sum(pulled) == count  # stalled, not creeping
    batches = [first, *it]
    check_stream(batches, per_frame(frames), B, {}, device)
    assert sum(pulled) == n
    assert fs.stats()["slot_wait_s"] >= 0.3  # and says so: the stager waited for a slot meanwhile


@pytest.mark.parametrize("device", DEVICES)
def test_infinite_source_break(device):
    B, ring = 4, 2
    pool = rand(16, 8, 12)
    pulled = [0]

    def camera():
        for i in itertools.count():
            pulled[0] += 1
            yield pool[i % 16].numpy()

    fs = FrameStream(camera(), batch_size=B, device=device, ring=ring, raw=True)
    assert fs.total is None
    for k, b in enumerate(fs):
        assert list(b.indices) == list(range(k * B, (k + 1) * B))
        assert torch.equal(b.frames.cpu(), pool[[i % 16 for i in b.indices]])
        assert pulled[0] <= (k + 1 + ring) * B + 1  # memory bounded: never far ahead
        if k == 5:
            break
    assert wait_stagers_gone() == []
    count = pulled[0]
    time.sleep(0.1)
    assert pulled[0] == count  # nothing pulls from the source any more
    assert count <= (6 + ring) * B + 1
    assert fs.frames_delivered == 6 * B and fs.batches_delivered == 6


# --- closing, abandoning, one pass at a time ------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_context_manager_closes(device):
    items = [f.numpy() for f in rand(40, 8, 12)]
    with FrameStream(items, batch_size=4, device=device, ring=2) as fs:
        assert list(next(iter(fs)).indices) == [0, 1, 2, 3]
    assert wait_stagers_gone() == []
    with FrameStream(items, batch_size=4, device=device, ring=2) as fs:
        it = iter(fs)  # still referenced when the block ends: __exit__ stops the thread
        assert list(next(it).indices) == [0, 1, 2, 3]
        assert len(stagers()) == 1
    assert wait_stagers_gone() == []
    del it
    gc.collect()
    check_stream(list(fs), per_frame(items), 4, {}, device)


@pytest.mark.parametrize("device", DEVICES)
def test_close_mid_iteration(device):
    items = [f.numpy() for f in rand(40, 8, 12)]
    fs = FrameStream(items, batch_size=4, device=device, ring=2)
    it = iter(fs)
    next(it)
    assert len(stagers()) == 1
    fs.close()
    assert wait_stagers_gone() == []
    del it
    gc.collect()


@pytest.mark.parametrize("device", DEVICES)
def test_close_with_the_source_blocked(device):
    """close() returns at once while the source is stuck in its own next() (a stalled camera): the
    staging thread is abandoned to it, and ends when next() returns, touching nothing more."""
    release = threading.Event()
    frames = rand(3, 8, 12)

    def camera():
        yield frames[0].numpy()
        yield frames[1].numpy()
        release.wait(30)  # stalled
        yield frames[2].numpy()

    fs = FrameStream(camera(), batch_size=2, device=device)
    it = iter(fs)
    first = next(it)
    time.sleep(0.1)  # the staging thread is inside the source's next() by now
    t0 = time.perf_counter()
    fs.close()
    elapsed = time.perf_counter() - t0
    release.set()
    assert elapsed < 0.5
    check_stream([first], list(frames[:2]), 2, {}, device)
    assert list(it) == []  # the pass ended at the close
    assert wait_stagers_gone() == []


@pytest.mark.parametrize("device", DEVICES)
def test_dropped_iterator_stops(device):
    items = [f.numpy() for f in rand(40, 8, 12)]
    fs = FrameStream(items, batch_size=4, device=device, ring=2)
    it = iter(fs)
    assert list(next(it).indices) == [0, 1, 2, 3]
    assert len(stagers()) == 1
    del it
    gc.collect()
    assert wait_stagers_gone() == []
    check_stream(list(fs), per_frame(items), 4, {}, device)  # a new pass from the start


@pytest.mark.parametrize("device", DEVICES)
def test_one_pass_at_a_time(device):
    items = [f.numpy() for f in rand(12, 8, 12)]
    fs = FrameStream(items, batch_size=4, device=device)
    it = iter(fs)
    first = next(it)
    with pytest.raises(RuntimeError, match="already being iterated"):
        iter(fs)
    check_stream([first, *it], per_frame(items), 4, {}, device)  # the first pass goes on unharmed


@pytest.mark.parametrize("device", DEVICES)
def test_one_pass_at_a_time_before_start(device):
    items = [f.numpy() for f in rand(12, 8, 12)]
    fs = FrameStream(items, batch_size=4, device=device)
    it1 = it2 = None
    try:
        it1 = iter(fs)
        with pytest.raises(RuntimeError, match="already being iterated"):
            it2 = iter(fs)
            next(it1)
            next(it2)
    finally:
        del it1, it2
        gc.collect()


@pytest.mark.parametrize("device", DEVICES)
def test_iterate_again(device):
    items = [f.numpy() for f in rand(10, 8, 12)]
    frames = per_frame(items)
    fs = FrameStream(items, batch_size=4, device=device)
    first = list(fs)
    second = list(fs)
    check_stream(first, frames, 4, {}, device)
    check_stream(second, frames, 4, {}, device)
    assert fs.frames_delivered == 10 and fs.batches_delivered == 3  # counted per pass


# --- progress -------------------------------------------------------------------------------------

STATS_KEYS = {"frames", "batches", "total", "elapsed_s", "fps", "stage_s", "wait_s", "slot_wait_s"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("generator", [False, True], ids=["list", "generator"])
def test_progress(device, generator):
    items = [f.numpy() for f in rand(10, 8, 12)]
    fs = FrameStream((x for x in items) if generator else items, batch_size=4, device=device)
    assert fs.frames_delivered == 0 and fs.batches_delivered == 0
    assert fs.elapsed_s == 0.0 and fs.fps == 0.0
    st = fs.stats()
    assert set(st) == STATS_KEYS
    assert st["frames"] == 0 and st["batches"] == 0
    assert st["total"] == (None if generator else 10)
    last_elapsed = 0.0
    for k, b in enumerate(fs):
        assert fs.frames_delivered == b.indices.stop
        assert fs.batches_delivered == k + 1
        st = fs.stats()
        assert st["frames"] == b.indices.stop and st["batches"] == k + 1
        assert st["elapsed_s"] >= last_elapsed
        last_elapsed = st["elapsed_s"]
        time.sleep(0.01)
    assert fs.frames_delivered == 10 and fs.batches_delivered == 3
    elapsed = fs.elapsed_s
    assert elapsed > 0.02 and fs.fps > 0
    assert fs.fps == pytest.approx(10 / elapsed)
    time.sleep(0.02)
    assert fs.elapsed_s == elapsed  # frozen at the end of the pass
    st = fs.stats()
    assert set(st) == STATS_KEYS
    assert st["frames"] == 10 and st["batches"] == 3
    assert st["total"] == (None if generator else 10)
    assert st["elapsed_s"] == elapsed and st["fps"] == fs.fps
    assert st["stage_s"] >= 0 and st["wait_s"] >= 0 and st["slot_wait_s"] >= 0
    assert st["stage_s"] + st["wait_s"] < elapsed + 1.0


# --- bad input ------------------------------------------------------------------------------------

# Frames (tensor data) of the wrong dtype or shape: RuntimeError; an item that is no array: TypeError.
BAD_ITEMS = {
    "float32 numpy": (lambda: np.zeros((8, 8, 3), np.float32), RuntimeError, "uint8"),
    "int16 tensor": (lambda: torch.zeros(2, 8, 8, 3, dtype=torch.int16), RuntimeError, "uint8"),
    "bool tensor": (lambda: torch.zeros(8, 8, 3, dtype=torch.bool), RuntimeError, "uint8"),
    "2-D": (lambda: np.zeros((8, 8), np.uint8), RuntimeError, r"\(H, W, C\) or \(N, H, W, C\)"),
    "5-D": (lambda: torch.zeros(1, 1, 8, 8, 3, dtype=torch.uint8), RuntimeError, r"\(N, H, W, C\)"),
    "1 channel": (lambda: np.zeros((8, 8, 1), np.uint8), RuntimeError, "C = 3 or 4"),
    "5 channels": (lambda: torch.zeros(2, 8, 8, 5, dtype=torch.uint8), RuntimeError, "C = 3 or 4"),
    "list": (lambda: [[0, 1, 2]] * 8, TypeError, "numpy arrays or tensors, got list"),
    "str": (lambda: "frame.png", TypeError, "numpy arrays or tensors, got str"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(BAD_ITEMS))
def test_bad_items(device, name):
    make, err, msg = BAD_ITEMS[name]
    good = [f.numpy() for f in rand(9, 8, 8)]
    fs = FrameStream([*good[:4], make(), *good[4:]], batch_size=2, device=device)
    got = []
    with pytest.raises(err, match=msg):
        for b in fs:
            got.append(b)
    assert indices_of(got) == [[0, 1], [2, 3]]  # raised in the caller, after the good batches
    assert wait_stagers_gone() == []


@pytest.mark.parametrize(
    "kw, err, msg",
    [
        (dict(batch_size=0), ValueError, "batch_size must be a positive int"),
        (dict(batch_size=-3), ValueError, "batch_size must be a positive int"),
        (dict(batch_size=2.0), TypeError, "batch_size must be a positive int"),
        (dict(ring=1), ValueError, "ring must be an int >= 2"),
        (dict(ring=0), ValueError, "ring must be an int >= 2"),
        (dict(ring=3.0), TypeError, "ring must be an int >= 2"),
        (dict(ring=True), TypeError, "ring must be an int >= 2, got True"),
        (dict(raw=True, size=32), ValueError, "raw=True takes no preprocessing arguments"),
        (dict(raw=True, mean=0.5), ValueError, "raw=True takes no preprocessing arguments"),
        (dict(device="meta"), ValueError, "device must be a CUDA device or the CPU"),
        (dict(batch_size=True), TypeError, "batch_size must be a positive int, got True"),
        (dict(raw=1), TypeError, "raw must be a bool, got 1"),
        (dict(model=5), TypeError, "model must be callable or None, got int"),
        (dict(device=True), TypeError, "device must be a torch.device, a string or None, got True"),
        (dict(device="gpu"), ValueError, "device must be a CUDA device or the CPU, got 'gpu'"),
        (dict(source=7), TypeError, "source must be an iterable of frames, got int"),
        (dict(sise=32), TypeError, r"unknown preprocessing argument\(s\) \['sise'\]"),
    ],
    ids=[
        "batch 0",
        "batch -3",
        "batch 2.0",
        "ring 1",
        "ring 0",
        "ring 3.0",
        "ring True",
        "raw size",
        "raw mean",
        "meta",
        "batch True",
        "raw 1",
        "model 5",
        "device True",
        "device gpu",
        "source 7",
        "misspelt size",
    ],
)
def test_bad_arguments(kw, err, msg):
    kw = {"device": "cpu", **kw}
    source = kw.pop("source", [rand(1, 4, 4)[0].numpy()])
    with pytest.raises(err, match=r"opforge\.video\.FrameStream: " + msg):
        FrameStream(source, **kw)
    assert stagers() == []  # nothing started


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(size=0), r"size must be positive"),
        (dict(letterbox=True), r"letterbox=True needs a size"),
        (dict(std=[1, 0, 1]), r"std must be finite and nonzero"),
        (dict(stride=0), r"stride must be a positive integer, got 0"),
        (dict(scale=1.0, std=1e-3), r"scale, mean and std must keep the normalized pixel values"),
    ],
    ids=["size 0", "letterbox without size", "std 0", "stride 0", "float16 overflow"],
)
def test_bad_preprocess_arguments_raise_in_the_constructor(kw, msg):
    """The preprocessing arguments are checked when the stream is made, not in its first batch."""
    with pytest.raises(ValueError, match=r"opforge\.preprocess_frames: " + msg):
        FrameStream([rand(1, 4, 4)[0].numpy()], device="cpu", **kw)
    assert stagers() == []


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(stride=32.0), r"stride must be a positive integer, got 32\.0"),
        (dict(out_dtype="float16"), r"out_dtype must be one of .*, got 'float16'"),
        (dict(pad_value=True), r"pad_value must be a pixel value in \[0, 255\], got True"),
    ],
    ids=["stride float", "out_dtype str", "pad bool"],
)
def test_preprocess_arguments_of_the_wrong_type_raise_type_error(kw, msg):
    """As preprocess_frames raises them: an argument of the wrong Python type is a TypeError."""
    with pytest.raises(TypeError, match=r"opforge\.preprocess_frames: " + msg):
        FrameStream([rand(1, 4, 4)[0].numpy()], device="cpu", **kw)
    assert stagers() == []


def test_cuda_device_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"opforge\.video\.FrameStream: device cuda:0 needs CUDA"):
        FrameStream([rand(1, 4, 4)[0].numpy()], device="cuda:0")
    assert stagers() == []


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("device", DEVICES)
def test_read_only_numpy_frames(device, monkeypatch):
    """Read-only numpy frames (a decoder's buffer, np.frombuffer of bytes) are copied once, as the
    flipped views are, before torch wraps them: no "non-writable" warning. (torch warns once a
    process, so the spy also checks each array torch wraps, whichever test warned first.)"""
    wrapped = []
    real = torch.from_numpy
    monkeypatch.setattr(torch, "from_numpy", lambda a: wrapped.append(a.flags.writeable) or real(a))
    frames = rand(6, 8, 12)
    items = [np.frombuffer(frames[:2].numpy().tobytes(), np.uint8).reshape(2, 8, 12, 3)]
    for f in frames[2:]:
        a = f.numpy().copy()
        a.setflags(write=False)
        items.append(a)
    assert not any(a.flags.writeable for a in items) and all(a.flags.c_contiguous for a in items)
    check_stream(list(FrameStream(items, batch_size=4, device=device)), list(frames), 4, {}, device)
    assert wrapped and all(wrapped)


@pytest.mark.parametrize("device", DEVICES)
def test_negative_stride_numpy_frames(device):
    frames = rand(3, 8, 12).numpy()
    items = [frames[0][..., ::-1], frames[1][:, ::-1], frames[2][::-1]]
    check_stream(list(FrameStream(items, batch_size=3, device=device)), per_frame(items), 3, {}, device)


# --- raw batches ----------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "source", ["single numpy frames", "tensor batches 3 8 5 1", "size change", "strided"]
)
def test_raw(device, source):
    items = SOURCES[source]()
    batches = list(FrameStream(items, batch_size=4, ring=2, device=device, raw=True))
    check_raw(batches, per_frame(items), 4, device)  # all kept: no ring slot was reused under them


@pytest.mark.parametrize("device", DEVICES)
def test_raw_many_batches_ring_2(device):
    frames = rand(4 * 12 + 1, 8, 12)
    items = [f.numpy() for f in frames]
    batches = list(FrameStream(items, batch_size=4, ring=2, device=device, raw=True))
    check_raw(batches, per_frame(items), 4, device)


def test_finished_iterator_collected_late_keeps_the_next_pass_claimed():
    """A finished iterator collected while a later pass runs must not release that pass's claim."""
    import gc

    src = [f.numpy() for f in torch.randint(0, 256, (10, 8, 8, 3), dtype=torch.uint8)]
    fs = FrameStream(src, batch_size=4)
    first = iter(fs)
    assert sum(b.frames.shape[0] for b in first) == 10
    second = iter(fs)
    next(second)
    del first
    gc.collect()
    with pytest.raises(RuntimeError, match="already being iterated"):
        iter(fs)
    assert sum(b.frames.shape[0] for b in second) == 6
    assert sum(b.frames.shape[0] for b in fs) == 10
