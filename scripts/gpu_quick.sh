#!/usr/bin/env bash
# A short GPU run for when little device time is left: build, the full benchmark of the ops in
# $OPS (comma-separated, default nms,matmul) with one timing round, then the tests of those ops and the
# CUDA tests of the rest, each step bounded so that what finished comes back under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)}
OUT=${OUT:-benchmarks/results/gpu-partial}
OPS=${OPS:-nms,matmul}  # before its first use: set -u
mkdir -p "$OUT"
export OPFORGE_BENCH_FAILURES="$OUT"
# The wgmma rung alone first (about 20 s to build): a kernel that hangs or faults would otherwise
# take the benchmark and test runs down with it; if it fails, they skip it (OPFORGE_SKIP_VARIANTS).
if [[ ",$OPS," == *",matmul,"* ]] && "$PYTHON" -c 'import torch, sys; sys.exit(torch.cuda.get_device_capability() != (9, 0))'; then
  if nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I csrc -o "$OUT/wgmma_standalone" \
      benchmarks/micro/wgmma_standalone.cu > "$OUT/wgmma_standalone.log" 2>&1 &&
      timeout 60 "$OUT/wgmma_standalone" >> "$OUT/wgmma_standalone.log" 2>&1; then
    echo "wgmma standalone: passed"
  else
    echo "wgmma standalone: FAILED (the rest skips wgmma)"; export OPFORGE_SKIP_VARIANTS=wgmma
  fi
  tail -4 "$OUT/wgmma_standalone.log"; rm -f "$OUT/wgmma_standalone"
fi
"$PYTHON" -m pip install -v --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "built"
timeout ${BENCH_TIMEOUT:-300} "$PYTHON" -m opforge.bench --full --ops "$OPS" --rounds 1 --out "$OUT" > "$OUT/bench.log" 2>&1
sed -n '/^op /,$p' "$OUT/bench.log"; tail -3 "$OUT/bench.log"
xdist=$("$PYTHON" -c 'import xdist' 2>/dev/null && echo "-n 8")
op_tests=$(for op in ${OPS//,/ }; do echo "tests/test_$op.py"; done)
timeout 180 "$PYTHON" -m pytest $op_tests -q -rs -p no:cacheprovider $xdist > "$OUT/tests_ops.log" 2>&1
tail -4 "$OUT/tests_ops.log"
timeout 60 "$PYTHON" -m pytest tests -q -p no:cacheprovider -m cuda $xdist > "$OUT/tests_cuda.log" 2>&1
tail -2 "$OUT/tests_cuda.log"
