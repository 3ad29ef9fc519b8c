"""Shared test setup: fresh random seeds, the `cuda` marker, device parametrization, no FrameStream
staging thread left behind by any test."""

from __future__ import annotations

import gc
import os
import random
import threading
import time
import zlib

import pytest
import torch

import opforge

HAS_CUDA = torch.cuda.is_available() and opforge.built_with_cuda()
LARGE_ON_CPU = os.environ.get("OPFORGE_TEST_LARGE") == "1"

# Fresh random data every run (never a fixed seed that could hide a bug), printed so that a
# failure can be replayed with OPFORGE_TEST_SEED=<seed>.
# Under pytest-xdist every worker derives the same seed from the run's shared id.
if "OPFORGE_TEST_SEED" in os.environ:
    SEED = int(os.environ["OPFORGE_TEST_SEED"])
elif "PYTEST_XDIST_TESTRUNUID" in os.environ:
    SEED = int(os.environ["PYTEST_XDIST_TESTRUNUID"][:8], 16) % 2**31
else:
    SEED = random.SystemRandom().randrange(2**31)


def pytest_report_header(config):
    cuda = torch.cuda.get_device_name() if HAS_CUDA else "none"
    return f"opforge: torch {torch.__version__}, CUDA device: {cuda}, seed: OPFORGE_TEST_SEED={SEED}"


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU and a CUDA build of opforge")
    skip_large = pytest.mark.skip(reason="allocates several GiB: CUDA only unless OPFORGE_TEST_LARGE=1")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_cuda)
        if "large" in item.keywords and "cuda" not in item.keywords and not LARGE_ON_CPU:
            item.add_marker(skip_large)


@pytest.fixture(autouse=True)
def _seed(request):
    seed = (SEED + zlib.crc32(request.node.nodeid.encode())) % 2**31
    torch.manual_seed(seed)
    random.seed(seed)
    yield


STAGER = "opforge-framestream"  # opforge.video.FrameStream's staging thread's name


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
    """Every test leaves no staging thread behind (a leak shows up in the test that made it).

    A thread still alive after the test gets what it may need to end: a garbage collection (an
    abandoned iterator in a reference cycle stops its thread when collected) and up to 5 s. The
    collection runs only then, not after every test (it took 65 s over the suite)."""
    yield
    if stagers():
        gc.collect()
        assert wait_stagers_gone() == [], "a FrameStream staging thread outlived its test"


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def poison_cuda_allocator(nbytes: int, device: str) -> None:
    """Leave NaN in the caching allocator's free blocks, so an output element the kernel
    fails to write shows up as NaN instead of a lucky zero (in 32- and 16-bit dtypes)."""
    if device.startswith("cuda"):
        # 0x7FC07FC0 is NaN as one float32 and as two bfloat16 or float16 values.
        blocks = [
            torch.full((max(nbytes, 4) // 4 + 64,), 0x7FC07FC0, dtype=torch.int32, device=device)
            for _ in range(2)
        ]
        del blocks


def capture_cuda_graph(fn):
    """fn captured in a CUDA graph after a warm-up on a side stream (kernel attributes, the
    allocator's pool), and its output from the capture: (graph, out)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out
