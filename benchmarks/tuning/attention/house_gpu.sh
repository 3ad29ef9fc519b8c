#!/usr/bin/env bash
# A kernel change against a baseline commit in one lease, in two runs back to back (the machine
# keeps ignored build outputs while it stays warm, ~30 s): issue 46's before/after table.
#   here:   bash benchmarks/tuning/attention/rows_at_commits.sh pack BASE     (.bisect/BASE.tar.gz)
#   run 1:  (carry [".bisect"]) bash benchmarks/tuning/attention/house_gpu.sh build
#           the working tree built in place (16 jobs), the baseline in .bisect_build/BASE (16 jobs),
#           then the CUDA tests (pytest -m cuda, 8 workers)
#   run 2:  bash benchmarks/tuning/attention/house_gpu.sh compare
#           a compute-sanitizer memcheck of the forms / paged / NaN tests (MEMCHECK=0 skips it), then
#           before_after.py compare BASE -> working tree (PASSES, default 3, alternating; ONLY=decode,paged
#           times only the rows whose names hold one of those words), JSON under $OUT
# Logs and results under $OUT (default /tmp/house). A run that finds no build says so and stops.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/house}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
base=$(basename "$(ls .bisect/*.tar.gz 2>/dev/null | head -1)" .tar.gz)
[ -n "$base" ] || { echo "no .bisect/*.tar.gz (rows_at_commits.sh pack BASE here, carry .bisect)"; exit 2; }
bdir=$PWD/.bisect_build/$base
case "${1:-}" in
build)
  { date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c 'import torch; print("torch", torch.__version__)'; } > "$OUT/env.txt" 2>&1
  start=$(date +%s)
  MAX_JOBS=16 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  echo "tree built in $(( $(date +%s) - start )) s"
  rm -rf "$bdir" && mkdir -p "$bdir" && tar xzf ".bisect/$base.tar.gz" -C "$bdir"
  (cd "$bdir" && MAX_JOBS=16 python3 setup.py build_ext --inplace > "$OUT/build_$base.log" 2>&1) \
    || { echo "$base: build failed"; tail -30 "$OUT/build_$base.log"; exit 1; }
  echo "$base built in $(( $(date +%s) - start )) s (both)"
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest tests -m cuda -q -n 8 -p no:cacheprovider > "$OUT/tests.log" 2>&1
  echo "tests: rc $?"; tail -5 "$OUT/tests.log" ;;
compare)
  [ -d "$bdir" ] && ls opforge/_C*.so > /dev/null 2>&1 || { echo "no builds here: run 'build' first (the machine went cold?)"; exit 2; }
  if [ "${MEMCHECK:-1}" = 1 ]; then
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 \
      python3 -m pytest -q -p no:cacheprovider tests/test_attention_cuda_forward.py tests/test_attention_cuda_kv_cache.py \
      -k "forms or nan or paged" > "$OUT/memcheck.log" 2>&1
    echo "memcheck: rc $?"; tail -3 "$OUT/memcheck.log"
  fi
  A_COMMIT=$base B_COMMIT=${OPFORGE_COMMIT:-working tree} timeout "${COMPARE_TIMEOUT:-400}" python3 benchmarks/tuning/attention/before_after.py compare "$bdir" "$PWD" \
    --passes "${PASSES:-3}" --json "$OUT/before_after.json" ${ONLY:+--only "$ONLY"} | tee "$OUT/before_after.txt" ;;
*) sed -n '2,11p' "$0"; exit 2 ;;
esac
