"""Sustained 4096^3 bf16 matmuls (opforge mma, cuBLAS, opforge wgmma, mma again), each for ~4 s
back to back, with nvidia-smi sampling the SM clock, board power, temperature and the active
clock-throttle reasons every 200 ms: which kernels run at the power cap, and at what clock.

    python benchmarks/tuning/matmul/matmul_power.py
"""

from __future__ import annotations

import subprocess
import time

import torch

import opforge

QUERY = (
    "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.sw_power_cap,"
    "clocks_throttle_reasons.hw_slowdown,clocks_throttle_reasons.sw_thermal_slowdown"
)


def main() -> None:
    n = 4096
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    runs = (
        ("mma", lambda: opforge.matmul(a, b, variant="mma")),
        ("cublas", lambda: torch.matmul(a, b)),
        ("wgmma", lambda: opforge.matmul(a, b, variant="wgmma")),
        ("mma", lambda: opforge.matmul(a, b, variant="mma")),
    )
    print("samples: SM clock, power, temperature, throttled by: power cap, hw slowdown, thermal")
    for name, fn in runs:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        smi = subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader", "-lms", "200"],
            stdout=subprocess.PIPE,
            text=True,
        )
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0, calls = time.time(), 0
        start.record()
        while time.time() - t0 < 4:
            for _ in range(50):
                fn()
            calls += 50
            torch.cuda.synchronize()
        end.record()
        torch.cuda.synchronize()
        smi.terminate()
        samples = smi.communicate()[0].strip().splitlines()
        ms = start.elapsed_time(end) / calls
        print(f"{name}: {2 * n**3 / ms / 1e9:.1f} TFLOP/s back to back (L2 warm)")
        print("  " + "\n  ".join(samples[3:-1:3]))


if __name__ == "__main__":
    main()
