#!/usr/bin/env bash
# A short GPU run for when little device time is left: build, the NMS benchmark, then the tests
# in order of importance, each step bounded so that what finished comes back under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)}
OUT=${OUT:-benchmarks/results/gpu-partial}
mkdir -p "$OUT"
"$PYTHON" -m pip install -v --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "built"
timeout 100 "$PYTHON" -m opforge.bench --full --ops nms --rounds 1 --out "$OUT" > "$OUT/bench.log" 2>&1
sed -n '/^op /,$p' "$OUT/bench.log"; tail -3 "$OUT/bench.log"
xdist=$("$PYTHON" -c 'import xdist' 2>/dev/null && echo "-n 8")
timeout 90 "$PYTHON" -m pytest tests/test_nms.py -q -rs -p no:cacheprovider $xdist > "$OUT/tests_nms.log" 2>&1
tail -4 "$OUT/tests_nms.log"
timeout 60 "$PYTHON" -m pytest tests/test_vector_add.py tests/test_package.py -q -p no:cacheprovider -m cuda $xdist > "$OUT/tests_rest.log" 2>&1
tail -2 "$OUT/tests_rest.log"
