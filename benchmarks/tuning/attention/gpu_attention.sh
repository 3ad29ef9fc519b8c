#!/usr/bin/env bash
# Attention on the GPU in one lease: build, the CUDA tests, bench rows by name, Nsight Compute on
# opforge's kernels of chosen rows, the full attention benchmark and a memcheck subset. Logs under $OUT.
#   CASES="sliding 512;causal"        rows timed against their peers (attention_cases.py)
#   NCU="random blocks 30%|--fwd-only;causal|;causal|--impl=FlashAttention-4|BackwardSm90"
#                                      rows whose kernel ncu profiles (row|flags|kernel regex): one launch (the
#                                      NCU_SKIP-th, default 1), sections, metrics and source-level
#                                      stall sampling (ncu_kernel.sh)
#   TESTS=0 BENCH=1 MEMCHECK=1         skip the tests / run the full benchmark / the memcheck subset
#   CASES_FLAGS=--graphs               extra flags for the CASES rows (attention_cases.py)
#   KERNEL=decode                      the kernel-name regex NCU profiles (default: hopper)
#   TESTS_K="forward" TESTS_FILES="tests/test_attention_cuda.py tests/test_matmul.py"   a test subset
# FlashAttention-4, where fa4_peer.sh installed it into /root/site on this machine, is on the path.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/attn}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
[ -d /root/site ] && export PYTHONPATH=$PWD:/root/site:/root/site/nvidia_cutlass_dsl/dsl_packages
status=0
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; echo "commit ${OPFORGE_COMMIT:-?}"; } > "$OUT/env.txt" 2>&1
start=$(date +%s)
MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
if [ "${TESTS:-1}" = 1 ]; then
  timeout 300 python3 -m pytest ${TESTS_FILES:-tests/test_attention_cuda.py} -q -n 8 -p no:cacheprovider -k "${TESTS_K:-}" > "$OUT/tests.log" 2>&1 || status=1
  tail -3 "$OUT/tests.log"
fi
IFS=';' read -ra rows <<< "${CASES:-}"
if [ ${#rows[@]} -gt 0 ]; then
  timeout 300 python3 benchmarks/tuning/attention/attention_cases.py "${rows[@]}" ${CASES_FLAGS:-} 2>&1 | grep -v Warn | tee "$OUT/cases.txt"
fi
IFS=';' read -ra specs <<< "${NCU:-}"
for spec in "${specs[@]}"; do  # one launch of the row's kernel: sections, metrics, hottest SASS lines
  IFS='|' read -r nrow nflags nkernel <<< "$spec"
  echo "== ncu $nrow $nflags ${nkernel:-${KERNEL:-hopper}}"
  bash benchmarks/tuning/attention/ncu_kernel.sh "$nrow" "${nkernel:-${KERNEL:-hopper}}" "${NCU_SKIP:-1}" "$OUT" "$nflags"
done
if [ "${BENCH:-0}" = 1 ]; then
  timeout 420 python3 -m opforge.bench --full --ops attention --out "$OUT/bench" > "$OUT/bench.log" 2>&1 || status=1
  sed -n '/^op /,/^wrote/p' "$OUT/bench.log"
fi
if [ "${MEMCHECK:-0}" = 1 ]; then
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest tests/test_attention_cuda.py -q -x \
    -m "cuda and not large" -k "${MEMCHECK_K:-not compile and not kernels}" -p no:cacheprovider > "$OUT/memcheck.log" 2>&1 || status=1
  tail -3 "$OUT/memcheck.log"
fi
# Everything in one archive (the device returns at most 8 files).
tar czf /tmp/attn.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/attn.tgz "$OUT/attn.tgz"
exit $status
