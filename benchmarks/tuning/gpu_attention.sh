#!/usr/bin/env bash
# Attention on the GPU in one lease: build, the CUDA tests, bench rows by name, Nsight Compute on
# opforge's kernels of chosen rows, the full attention benchmark and a memcheck subset. Logs under $OUT.
#   CASES="sliding 512;causal"        rows timed against their peers (attention_cases.py)
#   NCU="random blocks 30%|--fwd-only;causal|"   rows whose Hopper kernels ncu profiles (sections + stalls)
#   SRC="random blocks 30%|--fwd-only"  rows whose first Hopper kernel gets source-level stall sampling
#   TESTS=0 BENCH=1 MEMCHECK=1         skip the tests / run the full benchmark / the memcheck subset
#   CASES_FLAGS=--graphs               extra flags for the CASES rows (attention_cases.py)
#   KERNEL=decode                      the kernel-name regex NCU / SRC profile (default: hopper)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/attn}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
status=0
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; echo "commit ${OPFORGE_COMMIT:-?}"; } > "$OUT/env.txt" 2>&1
start=$(date +%s)
MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
if [ "${TESTS:-1}" = 1 ]; then
  timeout 300 python3 -m pytest tests/test_attention_cuda.py -q -n 8 -p no:cacheprovider > "$OUT/tests.log" 2>&1 || status=1
  tail -3 "$OUT/tests.log"
fi
IFS=';' read -ra rows <<< "${CASES:-}"
if [ ${#rows[@]} -gt 0 ]; then
  timeout 300 python3 benchmarks/tuning/attention_cases.py "${rows[@]}" ${CASES_FLAGS:-} 2>&1 | grep -v Warn | tee "$OUT/cases.txt"
fi
metrics=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,lts__t_bytes.sum.per_second
IFS=';' read -ra specs <<< "${NCU:-}"
n=0
for spec in "${specs[@]}"; do
  name=${spec%%|*}; flag=${spec#*|}; n=$((n + 1))
  count=$([ -z "$flag" ] && echo 3 || echo 1)
  timeout 200 ncu --clock-control none --kernel-name regex:${KERNEL:-hopper} --launch-skip $((count + 1)) --launch-count $count \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --metrics "$metrics" \
    python3 benchmarks/tuning/attention_cases.py "$name" $flag --opforge-only > "$OUT/ncu$n.txt" 2>&1
  echo "== ncu $name $flag"
  grep -E "attention_|Duration|Compute \(SM\) Throughput|Memory Throughput|gmma|stalled|conflicts|lts__t|Registers Per|Achieved Occ" "$OUT/ncu$n.txt" | grep -v "^==PROF" | head -60
done
IFS=';' read -ra specs <<< "${SRC:-}"
for spec in "${specs[@]}"; do
  name=${spec%%|*}; flag=${spec#*|}; rep="$OUT/src"
  timeout 200 ncu --clock-control none --kernel-name regex:${KERNEL:-hopper} --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats -o "$rep" -f \
    python3 benchmarks/tuning/attention_cases.py "$name" $flag --opforge-only > "$rep.log" 2>&1
  ncu -i "$rep.ncu-rep" --page source --print-source sass --csv > /tmp/src.csv 2>/dev/null
  python3 benchmarks/tuning/ncu_hot.py /tmp/src.csv 45 > "$OUT/src.txt" 2>&1
  head -c 7000 "$OUT/src.txt"
  rm -f "$rep.ncu-rep"
done
if [ "${BENCH:-0}" = 1 ]; then
  timeout 420 python3 -m opforge.bench --full --ops attention --out "$OUT/bench" > "$OUT/bench.log" 2>&1 || status=1
  sed -n '/^op /,/^wrote/p' "$OUT/bench.log"
fi
if [ "${MEMCHECK:-0}" = 1 ]; then
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest tests/test_attention_cuda.py -q -x \
    -m "cuda and not large" -k "${MEMCHECK_K:-not compile}" -p no:cacheprovider > "$OUT/memcheck.log" 2>&1 || status=1
  tail -3 "$OUT/memcheck.log"
fi
# Everything in one archive (the device returns at most 8 files).
tar czf /tmp/attn.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/attn.tgz "$OUT/attn.tgz"
exit $status
