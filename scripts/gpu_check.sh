#!/usr/bin/env bash
# One command on a CUDA machine: build with all cores, run every test (CUDA ones included), run
# the full benchmark, memcheck the CUDA tests; write logs and results under $OUT.
#   OPS=nms,matmul   benchmark (and memcheck) only these ops (default: all)
#   ROUNDS=1         interleaved timing rounds per benchmark case (default: the harness's, 3)
#   SANITIZE=0       skip the compute-sanitizer memcheck
# Exit status: non-zero when the build, a test, a benchmark check or the memcheck failed. Each
# step is time-bounded (TEST_TIMEOUT, BENCH_TIMEOUT, SANITIZE_TIMEOUT seconds): a hung kernel
# costs its step, not the whole run.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)}
OPS=${OPS:-}
ROUNDS=${ROUNDS:-}
status=0

# The device's folder: benchmarks/results/h200 for an NVIDIA H200.
slug=$("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name().lower().replace("nvidia ", "").replace(" ", "-") if torch.cuda.is_available() else "no-cuda")')
OUT=${OUT:-benchmarks/results/$slug}
mkdir -p "$OUT"
export OPFORGE_BENCH_FAILURES="$OUT"
echo "gpu-check: results in $OUT${OPS:+ (ops: $OPS)}"

{
  date -u
  nvidia-smi || true
  "$PYTHON" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name() if torch.cuda.is_available() else None)'
  echo "commit ${OPFORGE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  nvcc --version 2>/dev/null | tail -2
} > "$OUT/env.txt" 2>&1

echo "== build (MAX_JOBS=$MAX_JOBS)"
start=$(date +%s)
if ! { "$PYTHON" -m pip install -v --no-build-isolation --no-deps -e . || "$PYTHON" setup.py build_ext --inplace; } > "$OUT/build.log" 2>&1; then
  echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1
fi
echo "   built in $(( $(date +%s) - start )) s"; grep -A8 "opforge build configuration" "$OUT/build.log" | head -9

echo "== tests"
# pytest-xdist, when present, runs tests in worker processes: faster, and a crash of one test is
# reported as its failure instead of ending the run.
xdist=$("$PYTHON" -c 'import xdist' 2>/dev/null && echo "-n 8")
timeout "${TEST_TIMEOUT:-400}" "$PYTHON" -m pytest tests -q -rs -p no:cacheprovider $xdist > "$OUT/tests.log" 2>&1 || status=1
tail -5 "$OUT/tests.log"

echo "== benchmarks (full)"
timeout "${BENCH_TIMEOUT:-500}" "$PYTHON" -m opforge.bench --full ${OPS:+--ops "$OPS"} ${ROUNDS:+--rounds "$ROUNDS"} \
  --out "$OUT" > "$OUT/bench.log" 2>&1 || status=1
sed -n '/^op /,/^wrote/p' "$OUT/bench.log"

if command -v compute-sanitizer >/dev/null && [ "${SANITIZE:-1}" = 1 ]; then
  echo "== compute-sanitizer memcheck (CUDA tests, no large/compile)"
  files=tests
  [ -n "$OPS" ] && files=$(for op in ${OPS//,/ }; do echo "tests/test_$op.py"; done)
  timeout "${SANITIZE_TIMEOUT:-400}" compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$PYTHON" -m pytest $files -q -x -m "cuda and not large" -k "not compile" -p no:cacheprovider \
    > "$OUT/memcheck.log" 2>&1 || status=1
  tail -4 "$OUT/memcheck.log"
fi

echo "gpu-check: $([ $status = 0 ] && echo PASSED || echo FAILED)"
exit $status
