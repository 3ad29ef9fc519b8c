"""Tuning run for the matmul kernels' candidate configurations, without building the extension.

Compiles benchmarks/tuning/matmul/matmul_candidates.cu (the product's kernel headers instantiated with
named candidate traits) into a shared library (about a minute on 16 cores), then for every
candidate checks the result against a float64 reference on odd and batched shapes and times it
next to torch.matmul (cuBLAS) in the same process, with the benchmark's timer (L2 flushed before
every run). Prints one line per run.

    python benchmarks/tuning/matmul/matmul_tune.py --list
    python benchmarks/tuning/matmul/matmul_tune.py [--quick] [--only mma_ws,mma_ws.no_snake] [--b-columns]
    python benchmarks/tuning/matmul/matmul_tune.py --trace [mma_tma.traced]   # the TMA kernel's timeline at 4096^3
    python benchmarks/tuning/matmul/matmul_tune.py --power cublas,mma_ws,mix:bk96   # work per joule at the cap
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[3]
DTYPES = {torch.float32: 0, torch.float16: 2, torch.bfloat16: 3}


def build(out: pathlib.Path) -> ctypes.CDLL:
    nvcc = os.environ.get("NVCC", "nvcc")
    flags = [
        "-std=c++17",
        "-O3",
        "-gencode",
        "arch=compute_90a,code=sm_90a",
        "--expt-relaxed-constexpr",
        "-Xcompiler",
        "-fPIC",
        "-I",
        str(ROOT / "csrc"),
        "-DOPFORGE_WITH_CUDA=1",
        "-shared",
    ]
    so = out / "libmatmul_tune.so"
    src = ROOT / "benchmarks/tuning/matmul/matmul_candidates.cu"
    subprocess.run([nvcc, *flags, "-o", str(so), str(src)], check=True)
    lib = ctypes.CDLL(str(so))
    lib.opforge_tune_candidates.restype = ctypes.c_char_p
    lib.opforge_tune_matmul.restype = ctypes.c_int
    lib.opforge_tune_matmul.argtypes = (
        [ctypes.c_char_p] + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 11 + [ctypes.c_int, ctypes.c_void_p]
    )
    return lib


def candidates(lib) -> list[str]:
    return lib.opforge_tune_candidates().decode().split(",")


def load_timer():
    spec = importlib.util.spec_from_file_location("timing", ROOT / "opforge/bench/timing.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CudaTimer(torch.device("cuda"))


def runner(lib, name: str, a: torch.Tensor, b: torch.Tensor, b_columns: bool = False):
    """A callable computing a @ b with candidate `name` into a fresh output; a, b contiguous
    (batch, ., .); b_columns: b handed over as the rows of b^T (x @ w.t(); wgmma only)."""
    batch, m, k = a.shape
    n = b.shape[2]
    c = torch.empty(batch, m, n, dtype=a.dtype, device=a.device)
    if b_columns:
        b = b.transpose(1, 2).contiguous()  # (batch, n, k): b^T's rows
        b_rs, b_cs, b_bs = 1, k, n * k
    else:
        b_rs, b_cs, b_bs = n, 1, k * n
    stream = torch.cuda.current_stream().cuda_stream

    def fn():
        err = lib.opforge_tune_matmul(
            name.encode(),
            a.data_ptr(),
            b.data_ptr(),
            c.data_ptr(),
            batch,
            m,
            n,
            k,
            k,
            b_rs,
            b_cs,
            n,
            m * k,
            b_bs,
            m * n,
            DTYPES[a.dtype],
            stream,
        )
        if err:
            raise RuntimeError(f"{name}: CUDA error {err}")
        return c

    return fn


def check(lib, name, dtype, shape, b_columns=False) -> float:
    batch, m, k, n = shape
    g = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(batch, m, k, device="cuda", generator=g).to(dtype)
    b = torch.randn(batch, k, n, device="cuda", generator=g).to(dtype)
    out = runner(lib, name, a, b, b_columns)().double()
    ref = torch.matmul(a.double(), b.double())
    return ((out - ref).abs().max() / ref.abs().max()).item()


def trace_report(lib, name: str = "mma_tma.traced") -> None:
    """Runs a tracing candidate of the TMA kernel (mma_tma.traced: the shipped one stamping the SM
    clock at its hand-over points; mma_tma.k64_traced: 64-deep k tiles) at 4096^3 and prints where
    its warps' time goes between k tiles, from the first 16 blocks' timelines."""
    import numpy as np

    a = torch.randn(1, 4096, 4096, device="cuda").to(torch.bfloat16)
    b = torch.randn(1, 4096, 4096, device="cuda").to(torch.bfloat16)
    fn = runner(lib, name, a, b)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    buf = np.zeros((16, 8, 64, 3), dtype=np.uint64)
    err = lib.opforge_tune_mma_trace(ctypes.c_void_p(buf.ctypes.data), ctypes.c_size_t(buf.nbytes))
    if err:
        raise RuntimeError(f"trace copy: CUDA error {err}")
    # 96-deep k tiles (the shipped depth) fill 43 of the 64 slots at 4096^3: keep those.
    buf = buf[:, :, : max(4, int((buf[:, :, :, 0] > 0).all(axis=(0, 1)).sum()))]
    analyse_trace(buf)
    # The SM clock the blocks ran at: a block's cycles (first fill to last release) times the
    # blocks each SM runs in turn (512 tiles on the GPU's SMs), over the kernel's time.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        fn()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / 20
    t = buf.astype(np.float64)
    cycles = (t[:, :, -1, 0].max(axis=1) - t[:, 0, 0, 2]).mean()  # to the last traced tile
    waves = 512 / torch.cuda.get_device_properties(0).multi_processor_count
    print(
        f"kernel {ms:.3f} ms (back to back, L2 warm); a block {cycles:.0f} cycles; x {waves:.2f} waves -> "
        f"about {cycles * np.ceil(waves) / (ms * 1e6):.2f} GHz (a lower bound: launch, prologue and epilogue count as time)"
    )


def analyse_trace(buf) -> None:
    import numpy as np

    blocks, warps, tiles, _ = buf.shape
    t = buf.astype(np.float64)
    rel, landed, fill = t[..., 0], t[..., 1], t[:, 0, :, 2]  # fill[blk, j]: stage fill of k tile j issued
    start = fill[:, 0]
    period = (rel[:, :, -1] - rel[:, :, 0]) / (tiles - 1)  # cycles per k tile, per warp
    # Between a warp's release of tile j and the data of tile j + 1 landing for it: the atomic,
    # the (maybe) refill, the full-barrier wait. landed[..., j] is tile j's landing (j >= 1).
    gap = landed[:, :, 1:] - rel[:, :, :-1]
    skew = rel.max(axis=1) - rel.min(axis=1)  # per block and tile: first to last warp releasing it
    # Tile j's fill (j >= 3) is issued by the last warp releasing tile j - 3; it lands for the
    # first warp to need it no earlier than landed.min over warps.
    lat = landed[:, :, 3:].min(axis=1) - fill[:, 3:]
    pct = lambda x: " / ".join(f"{np.percentile(x, q):.0f}" for q in (10, 50, 90, 99))  # noqa: E731
    print(f"blocks traced {blocks}, warps {warps}, k tiles {tiles} (4096^3, 128 x 256 tiles)")
    print(f"cycles per k tile per warp (10/50/90/99th pct): {pct(period)}")
    print(f"release -> next tile landed, per warp and tile: {pct(gap)}")
    print(
        f"  share of the block's time: {gap.sum(axis=2).mean() / (rel[:, :, -1] - rel[:, :, 0]).mean():.1%}"
    )
    print(
        f"  mean over the first 4 k tiles: {gap[:, :, :4].mean():.0f}, over the rest: {gap[:, :, 4:].mean():.0f}"
    )
    print(f"warps' skew at a tile's release (last - first): {pct(skew)}")
    print(f"fill issued -> first warp past its wait: {pct(lat)}")
    print(f"first release after the block's first fill: {pct(rel[:, :, 0].min(axis=1) - start)}")
    late = gap > np.percentile(gap, 50) * 3
    print(
        f"gaps over 3x the median: {late.mean():.1%}, at k tiles {np.bincount(np.nonzero(late)[2], minlength=tiles - 1)[:12]}..."
    )


SMI_QUERY = "clocks.sm,power.draw,clocks_throttle_reasons.sw_power_cap"


def sustained(run, seconds: float = 4.0) -> tuple[float, list[str]]:
    """Runs run(seconds) (which returns its TFLOP/s) with nvidia-smi sampling the SM clock, board
    power and the power-cap throttle every 200 ms; returns the rate and the samples taken after
    the first second."""
    smi = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits", "-lms", "200"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        rate = run(seconds)
    finally:
        smi.terminate()
    samples = smi.communicate()[0].strip().splitlines()
    return rate, samples[5:-1]


def power_report(lib, items: list[str], mix_bin: pathlib.Path | None) -> None:
    """Each item (cublas, a candidate's name, mix:NAME) at bf16 4096^3 (mix: mma_mix.cu's loop, no memory
    traffic) back to back for 4 s, L2 warm: its TFLOP/s, SM clock and board power at the cap, and
    its work per joule (GFLOP/J = TFLOP/s per kW)."""
    n = 4096
    a = torch.randn(1, n, n, device="cuda").to(torch.bfloat16)
    b = torch.randn(1, n, n, device="cuda").to(torch.bfloat16)
    flop = 2 * n**3

    def timed(fn):
        def run(seconds):
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0, calls = time.time(), 0
            start.record()
            while time.time() - t0 < seconds:
                for _ in range(20):
                    fn()
                calls += 20
                torch.cuda.synchronize()
            end.record()
            torch.cuda.synchronize()
            return flop * calls / (start.elapsed_time(end) * 1e-3) / 1e12

        return run

    print("bf16 4096^3 back to back, 4 s each (L2 warm); clock and power: mean of the samples after 1 s")
    for item in items:
        if item == "cublas":
            run = timed(lambda: torch.matmul(a[0], b[0]))
        elif item in candidates(lib):
            run = timed(runner(lib, item, a, b))
        elif item.startswith("mix:") and mix_bin is not None:
            name = item[4:]

            def run(seconds, name=name):
                res = subprocess.run(
                    [str(mix_bin), "sustain", name, str(seconds * 1e3)], capture_output=True, text=True
                )
                return float(res.stdout.split(":")[1].split()[0])
        else:
            raise ValueError(f"--power: unknown item {item}")
        rate, samples = sustained(run)
        rows = [r.split(",") for r in samples]
        clock = statistics.mean(float(r[0]) for r in rows) if rows else float("nan")
        watts = statistics.mean(float(r[1]) for r in rows) if rows else float("nan")
        capped = sum("Active" in r[2] for r in rows)
        print(
            f"  {item:12s} {rate:7.1f} TFLOP/s  {clock:6.0f} MHz  {watts:5.0f} W  power-capped {capped}/{len(rows)} "
            f"samples  {rate / watts * 1e3:6.1f} GFLOP/J",
            flush=True,
        )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--list", action="store_true", help="print the candidates' names")
    ap.add_argument("--quick", action="store_true", help="4096^3 only")
    ap.add_argument(
        "--only", default="", help="comma-separated candidates, or prefixes (mma_ws,wgmma.); default all"
    )
    ap.add_argument("--b-columns", action="store_true", help="wgmma: b as the rows of b^T (x @ w.t())")
    ap.add_argument("--profile", default="", help="a candidate: three calls at 4096^3 (for ncu), no timing")
    ap.add_argument(
        "--trace", nargs="?", const="mma_tma.traced", help="a traced candidate's timeline at 4096^3"
    )
    ap.add_argument(
        "--power",
        default="",
        help="comma-separated items (cublas, a candidate, mix:peak|ldmatrix|bk96), each sustained 4 s at bf16 "
        "4096^3 with nvidia-smi power sampling",
    )
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(pathlib.Path(tmp))
        names = candidates(lib)
        if args.list:
            print("\n".join(names))
            return 0
        if args.power:
            items = args.power.split(",")
            mix_bin = None
            if any(i.startswith("mix:") for i in items):
                mix_bin = pathlib.Path(tmp) / "mma_mix"
                nvcc = os.environ.get("NVCC", "nvcc")
                src = ROOT / "benchmarks/tuning/matmul/mma_mix.cu"
                cmd = [
                    nvcc,
                    "-std=c++17",
                    "-O3",
                    "-gencode",
                    "arch=compute_90a,code=sm_90a",
                    "-I",
                    str(ROOT / "csrc"),
                ]
                subprocess.run([*cmd, "-o", str(mix_bin), str(src)], check=True)
            power_report(lib, items, mix_bin)
            return 0
        if args.trace:
            trace_report(lib, args.trace)
            return 0
        if args.profile:
            dtype = torch.float32 if args.profile.startswith("warp_tiled") else torch.bfloat16
            a = torch.randn(1, 4096, 4096, device="cuda").to(dtype)
            b = torch.randn(1, 4096, 4096, device="cuda").to(dtype)
            fn = runner(lib, args.profile, a, b)
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            return 0
        wanted = [w for w in args.only.split(",") if w]
        chosen = [n for n in names if not wanted or any(n == w or n.startswith(w) for w in wanted)]
        timer = load_timer()
        bad = 0
        for name in chosen:
            if name.endswith("traced"):
                continue  # timelines, not timings
            dtype = torch.float32 if name.startswith("warp_tiled") else torch.bfloat16
            cols = args.b_columns and name.startswith("wgmma")
            shapes = (
                [(4096, 4096, 4096)]
                if args.quick
                else [(2048,) * 3, (4096,) * 3, (8192,) * 3, (8192, 1024, 8192)]
            )
            odd = [(1, 1000, 1000, 1000), (3, 130, 72, 264), (2, 129, 4104, 136), (1, 1, 8, 8)]
            # more tiles than SMs, in whole and partial groups of tile rows, batched
            odd += [(1, 2000, 1000, 2104), (5, 1000, 520, 1000), (1, 4096, 4096, 4096)]
            errs = [check(lib, name, dtype, s, cols) for s in odd]
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            ok = all(e <= tol for e in errs)
            bad += not ok
            print(
                f"{name} {str(dtype)[6:]} check: {'ok' if ok else 'FAILED'} max rel err {max(errs):.2e}",
                flush=True,
            )
            for m, k, n in shapes:
                a = torch.randn(1, m, k, device="cuda").to(dtype)
                b = torch.randn(1, k, n, device="cuda").to(dtype)
                ours = timer(runner(lib, name, a, b, cols))
                a2, b2 = a[0], b[0]
                peer = timer(lambda a2=a2, b2=b2: torch.matmul(a2, b2))
                tf = 2 * m * n * k / 1e9
                print(
                    f"  {name} {str(dtype)[6:]} {m}x{k}x{n}: {ours:.3f} ms {tf / ours:7.1f} "
                    f"TFLOP/s | cuBLAS {peer:.3f} ms {tf / peer:7.1f} | {peer / ours:.3f}x",
                    flush=True,
                )
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
