"""Timers: CUDA events with an L2 flush between runs, torch.utils.benchmark on the CPU; the
device's copy ceiling and last-level cache."""

from __future__ import annotations

import glob
import statistics
import time
from collections.abc import Callable

import torch
import torch.utils.benchmark as tbench

_L2_FLUSH_BYTES = 256 << 20  # > the 60 MB L2 of an H200, with margin for larger parts
_LLC_FALLBACK_BYTES = 32 << 20  # when sysfs does not say: a server's L3 slice is 16 to 96 MiB
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class CudaTimer:
    """Median of event-timed runs after warm-up; the L2 is flushed before every timed run.

    Like ``triton.testing.do_bench``: each run is preceded by a write of 256 MB, so inputs that
    would fit in L2 are read from device memory as they would be in a real pipeline.
    """

    def __init__(self, device: torch.device, warmup_ms: float = 25.0, rep_ms: float = 100.0) -> None:
        self.device = device
        self.warmup_ms = warmup_ms
        self.rep_ms = rep_ms
        self._flush = torch.empty(_L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)

    # Calls this long (a whole generate(), a model's long prefill) are timed three times after one
    # warm-up call: their median is stable, and ten or more repetitions would take minutes a case.
    LONG_MS = 50.0

    def __call__(self, fn: Callable[[], object]) -> float:
        """Return the median time of one call of ``fn``, in milliseconds."""
        fn()
        torch.cuda.synchronize(self.device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(self.device)
        if start.elapsed_time(end) > self.LONG_MS:
            times = []
            for _ in range(3):
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize(self.device)
                times.append(start.elapsed_time(end))
            return statistics.median(times)
        start.record()
        for _ in range(5):
            self._flush.zero_()
            fn()
        end.record()
        torch.cuda.synchronize(self.device)
        estimate = max(start.elapsed_time(end) / 5, 1e-3)
        for _ in range(max(1, int(self.warmup_ms / estimate))):
            fn()
        n = min(max(int(self.rep_ms / estimate), 10), 1000)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            self._flush.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize(self.device)
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


class CpuTimer:
    """Median of ``torch.utils.benchmark`` blocked runs, on all of torch's threads."""

    def __init__(self, min_run_time: float = 0.5) -> None:
        self.min_run_time = min_run_time

    def __call__(self, fn: Callable[[], object]) -> float:
        fn()
        timer = tbench.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
        return timer.blocked_autorange(min_run_time=self.min_run_time).median * 1e3


def wall_median_ms(fn: Callable[[], object], reps: int = 40) -> float:
    """Median wall time of single CPU calls (after one warm-up), in milliseconds: what one call of
    a small op costs, a stall included, where blocked_autorange would average many calls."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def make_timer(device: torch.device, quick: bool) -> Callable[[Callable[[], object]], float]:
    if device.type == "cuda":
        return CudaTimer(device, warmup_ms=10 if quick else 25, rep_ms=40 if quick else 100)
    return CpuTimer(min_run_time=0.2 if quick else 0.5)


def copy_bandwidth_gbps(device: torch.device, quick: bool) -> float:
    """The device's practical memory ceiling: a large copy, bytes read + written per second."""
    nbytes = (64 << 20) if device.type == "cpu" else (1 << 30)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = make_timer(device, quick)(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _parse_size(text: str) -> int:
    """sysfs's cache size ("32768K", "1M", "512") in bytes."""
    text = text.strip()
    if text[-1:].upper() in _UNITS:
        return int(text[:-1]) * _UNITS[text[-1].upper()]
    return int(text)


def last_level_cache_bytes(device: torch.device, pattern: str | None = None) -> int | None:
    """The CPU's largest cache (cpu0's, from sysfs; 32 MiB when unreadable). None on CUDA: the
    timer flushes the L2 before every run, so no input is served from it."""
    if device.type == "cuda":
        return None
    sizes = []
    for path in glob.glob(pattern or "/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                sizes.append(_parse_size(f.read()))
        except (OSError, ValueError):
            continue
    return max(sizes, default=_LLC_FALLBACK_BYTES)
