"""opforge.video: FrameStream (order, values, batching, model, errors, back-pressure, closing,
progress, raw batches, the CUDA ring and direct paths), read_frames / write_clip (PyAV),
scale_boxes, and the ``opforge demo detect`` demo."""

from __future__ import annotations

import gc
import itertools
import threading
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES

import opforge
from opforge import reference
from opforge.ops.preprocess_frames import FrameInfo, letterbox_geometry
from opforge.video import FrameStream, StreamBatch, read_frames, scale_boxes, write_clip

STAGER = "opforge-framestream"  # the staging thread's name


# --- helpers -----------------------------------------------------------------------------------


def stagers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == STAGER and t.is_alive()]


def wait_stagers_gone(timeout: float = 5.0) -> list[threading.Thread]:
    """The staging threads still alive after waiting up to ``timeout`` seconds for them to end."""
    deadline = time.monotonic() + timeout
    while stagers() and time.monotonic() < deadline:
        time.sleep(0.01)
    return stagers()


@pytest.fixture(autouse=True)
def _no_stager_left():
    """Every test leaves no staging thread behind (a leak shows up in the test that made it)."""
    yield
    gc.collect()
    assert wait_stagers_gone() == [], "a FrameStream staging thread outlived its test"


def rand(n, h, w, c=3) -> torch.Tensor:
    return torch.randint(0, 256, (n, h, w, c), dtype=torch.uint8)


def per_frame(items) -> list[torch.Tensor]:
    """The source's frames one by one, as contiguous CPU (H, W, C) copies."""
    out = []
    for item in items:
        t = torch.from_numpy(np.array(item)) if isinstance(item, np.ndarray) else item.cpu()
        if t.dim() == 3:
            t = t.unsqueeze(0)
        out.extend(t[i].contiguous().clone() for i in range(t.shape[0]))
    return out


def expected_chunks(frames: list[torch.Tensor], batch_size: int) -> list[list[int]]:
    """Batches as FrameStream documents them: runs of equal frame shapes, cut every batch_size."""
    chunks, cur = [], []
    for i, f in enumerate(frames):
        if cur and (f.shape != frames[cur[0]].shape or len(cur) == batch_size):
            chunks.append(cur)
            cur = []
        cur.append(i)
    if cur:
        chunks.append(cur)
    return chunks


def indices_of(batches) -> list[list[int]]:
    return [list(b.indices) for b in batches]


def geometry_opts(kw: dict) -> dict:
    return {k: kw[k] for k in ("scaleup", "stride", "center") if k in kw}


def check_batch(b: StreamBatch, raw: torch.Tensor, kw: dict, device) -> None:
    """b is the batch of the CPU frames raw, preprocessed with kw on device."""
    assert isinstance(b, StreamBatch)
    assert b.frames.device.type == torch.device(device).type
    result = opforge.preprocess_frames(raw.to(device), **kw)
    want, want_info = result if kw.get("letterbox") else (result, None)
    assert b.frames.shape == want.shape and b.frames.dtype == want.dtype
    assert torch.equal(b.frames, want)
    h, w = raw.shape[1:3]
    if kw.get("letterbox"):
        assert b.info == want_info == letterbox_geometry((h, w), kw["size"], **geometry_opts(kw))
    else:
        size = kw.get("size")
        out = (h, w) if size is None else ((size, size) if isinstance(size, int) else tuple(size))
        assert b.info == FrameInfo((h, w), out, out, (0, 0), (out[0] / h, out[1] / w))
    if "size" not in kw:  # no resize: bit-identical to the plain PyTorch chain on the CPU
        assert torch.equal(b.frames.cpu(), reference.preprocess_frames(raw, **kw))
    assert b.output is None


def check_stream(batches, frames, batch_size, kw, device) -> None:
    chunks = expected_chunks(frames, batch_size)
    assert indices_of(batches) == chunks
    assert [i for b in batches for i in b.indices] == list(range(len(frames)))
    for b, chunk in zip(batches, chunks, strict=True):
        check_batch(b, torch.stack([frames[i] for i in chunk]), kw, device)


def check_raw(batches, frames, batch_size, device) -> None:
    """raw=True batches: the source's uint8 frames, unchanged, in order."""
    chunks = expected_chunks(frames, batch_size)
    assert indices_of(batches) == chunks
    for b, chunk in zip(batches, chunks, strict=True):
        assert b.info is None and b.output is None
        assert b.frames.dtype == torch.uint8 and b.frames.device.type == torch.device(device).type
        assert torch.equal(b.frames.cpu(), torch.stack([frames[i] for i in chunk]))


# --- 1. order, no loss, no duplicates, values -------------------------------------------------


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


# --- 2. the model ------------------------------------------------------------------------------


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


# --- 3. errors in the source ---------------------------------------------------------------------


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


# --- 4. back-pressure and infinite sources ---------------------------------------------------


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


# --- 5. closing, abandoning, one pass at a time ------------------------------------------------


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


# --- 6. progress -------------------------------------------------------------------------------

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


# --- 7. bad input ------------------------------------------------------------------------------

BAD_ITEMS = {
    "float32 numpy": (lambda: np.zeros((8, 8, 3), np.float32), TypeError, "uint8"),
    "int16 tensor": (lambda: torch.zeros(2, 8, 8, 3, dtype=torch.int16), TypeError, "uint8"),
    "bool tensor": (lambda: torch.zeros(8, 8, 3, dtype=torch.bool), TypeError, "uint8"),
    "2-D": (lambda: np.zeros((8, 8), np.uint8), ValueError, r"\(H, W, C\) or \(N, H, W, C\)"),
    "5-D": (lambda: torch.zeros(1, 1, 8, 8, 3, dtype=torch.uint8), ValueError, r"\(N, H, W, C\)"),
    "1 channel": (lambda: np.zeros((8, 8, 1), np.uint8), ValueError, "C = 3 or 4"),
    "5 channels": (lambda: torch.zeros(2, 8, 8, 5, dtype=torch.uint8), ValueError, "C = 3 or 4"),
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
        (dict(batch_size=2.0), ValueError, "batch_size must be a positive int"),
        (dict(ring=1), ValueError, "ring must be an int >= 2"),
        (dict(ring=0), ValueError, "ring must be an int >= 2"),
        (dict(ring=3.0), ValueError, "ring must be an int >= 2"),
        (dict(raw=True, size=32), ValueError, "raw=True takes no preprocessing arguments"),
        (dict(raw=True, mean=0.5), ValueError, "raw=True takes no preprocessing arguments"),
        (dict(device="meta"), ValueError, "device must be a CUDA device or the CPU"),
        (dict(batch_size=True), ValueError, "batch_size must be a positive int, got True"),
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


# --- 8. raw batches --------------------------------------------------------------------------


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


# --- 9. read_frames and write_clip -------------------------------------------------------------


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


# --- 10. scale_boxes -------------------------------------------------------------------------


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
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 4\)"):
        scale_boxes(torch.zeros(5, 5), info)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 4\)"):
        scale_boxes(torch.zeros(4, 2), info)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 4\)"):
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


# --- 11. the demo ------------------------------------------------------------------------------

RED = torch.tensor([255, 0, 0], dtype=torch.uint8).view(3, 1)


def check_drawn(png: str, frame_hwc: torch.Tensor) -> None:
    """The PNG is the frame with red box outlines drawn on it, nothing else changed."""
    from torchvision.io import read_image

    image = read_image(png)
    frame = frame_hwc.permute(2, 0, 1)
    assert image.shape == frame.shape and image.dtype == torch.uint8
    changed = (image != frame).any(dim=0)
    assert changed.sum() > 100  # boxes were drawn
    assert (image[:, changed] == RED).all()


def test_demo_synthetic(tmp_path, capsys):
    pytest.importorskip("torchvision")
    from opforge.video import demo

    out = tmp_path / "out.png"
    assert demo.main(["--device", "cpu", "--frames", "8", "--batch", "4", "--save", str(out)]) == 0
    assert out.exists()
    check_drawn(str(out), torch.from_numpy(demo.synthetic_clip(8)[0]))
    text = capsys.readouterr().out
    assert "8 frames of (1080, 1920, 3) on cpu, batch 4" in text
    assert f"wrote {out}" in text


def test_demo_video_file(tmp_path, capsys):
    pytest.importorskip("torchvision")
    pytest.importorskip("av")
    from opforge.video import demo

    path = str(tmp_path / "clip.mp4")
    write_clip(path, np.stack(demo.synthetic_clip(6, 180, 320, seed=int(torch.randint(0, 2**16, ())))))
    out = tmp_path / "out.png"
    assert demo.main([path, "--device", "cpu", "--frames", "5", "--batch", "4", "--save", str(out)]) == 0
    assert "5 frames of (180, 320, 3) on cpu" in capsys.readouterr().out
    check_drawn(str(out), next(read_frames(path, batch_size=1))[0])


def test_cli_demo_help(capsys):
    import opforge.cli

    with pytest.raises(SystemExit) as excinfo:
        opforge.cli.main(["demo", "detect", "--help"])
    assert excinfo.value.code == 0
    text = capsys.readouterr().out
    assert "opforge demo detect" in text and "--graph" in text and "--save" in text


def test_cli_demo_graph_needs_cuda(capsys):
    import opforge.cli

    assert opforge.cli.main(["demo", "detect", "--device", "cpu", "--graph"]) == 2
    assert "--graph needs a CUDA device" in capsys.readouterr().err


# --- 12. CUDA: the direct (pinned / on-device) and ring (pageable) paths -------------------------

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
