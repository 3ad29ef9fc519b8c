#!/usr/bin/env bash
# Matmul tuning on the GPU without the extension build: the tensor-core ceilings
# (benchmarks/tuning/common/tensor_peak.cu), named candidates against cuBLAS
# (benchmarks/tuning/matmul/matmul_tune.py: --list names them), and Nsight Compute on chosen candidates.
# Logs under $OUT.
#   TUNE="mma_ws,mma_ws.no_snake wgmma." NCU="wgmma.wide_tma_store" bash benchmarks/tuning/matmul/gpu_tune.sh
#   TUNE entries: comma-separated names or prefixes, one matmul_tune.py run each
#   TRACE=1: the TMA kernel's timeline (mma_tma.traced); TRACE="mma_tma.k64_traced": another traced candidate
#   MIX=1: the mma rung's inner-loop ceilings, ingredient by ingredient (benchmarks/tuning/matmul/mma_mix.cu)
#   POWER="cublas,mma_ws,mix:bk96": sustained rates, clock and board power (work per joule at the cap)
#   NOPEAK=1: skip the ceilings
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/tune}
mkdir -p "$OUT"
if [ -z "${NOPEAK:-}" ]; then
  nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I csrc -o "$OUT/peak" benchmarks/tuning/common/tensor_peak.cu &&
    timeout 60 "$OUT/peak" 2>&1 | tee "$OUT/peak.log"
  rm -f "$OUT/peak"
fi
if [ -n "${MIX:-}" ]; then
  nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I csrc -o "$OUT/mix" benchmarks/tuning/matmul/mma_mix.cu &&
    timeout 60 "$OUT/mix" 2>&1 | tee "$OUT/mix.log"
  rm -f "$OUT/mix"
fi
for spec in ${TUNE:-}; do
  timeout ${TUNE_TIMEOUT:-200} python3 benchmarks/tuning/matmul/matmul_tune.py ${QUICK:+--quick} --only "$spec" 2>&1 |
    grep -v Warning | tee -a "$OUT/tune.log"
done
# POWER="cublas,mma_ws,mix:bk96": each sustained 4 s at bf16 4096^3 with nvidia-smi sampling (work per joule at the cap).
for items in ${POWER:-}; do
  timeout 240 python3 benchmarks/tuning/matmul/matmul_tune.py --power "$items" 2>&1 | grep -v Warning | tee -a "$OUT/power.log"
done
# TRACE=1: the shipped TMA kernel traced (mma_tma.traced); or traced candidates' names, one log each.
for name in ${TRACE:-}; do
  [ "$name" = 1 ] && name=mma_tma.traced
  timeout 200 python3 benchmarks/tuning/matmul/matmul_tune.py --trace "$name" 2>&1 | grep -v Warning | tee "$OUT/trace-$name.log"
done
for spec in ${NCU:-}; do
  timeout 120 ncu --clock-control none --kernel-name regex:matmul_ --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section LaunchStats --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis_Tables --section Occupancy \
    --metrics smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,lts__t_bytes.sum.per_second,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum \
    python3 benchmarks/tuning/matmul/matmul_tune.py --profile "$spec" > "$OUT/ncu-$spec.txt" 2>&1
  grep -E "Duration|Throughput|Grid Size|stalled|pipe|conflicts|lts__|wavefronts|Issue|Registers" "$OUT/ncu-$spec.txt" | head -60
done
# Source-level stall sampling: SRC="mma_cp_async" -> the hottest SASS lines (benchmarks/tuning/common/ncu_hot.py).
for spec in ${SRC:-}; do
  rep="$OUT/src-$spec"
  timeout 150 ncu --clock-control none --kernel-name regex:matmul_ --launch-skip 1 --launch-count 1 \
    --section SourceCounters --section WarpStateStats -o "$rep" -f \
    python3 benchmarks/tuning/matmul/matmul_tune.py --profile "$spec" > "$rep.log" 2>&1
  ncu -i "$rep.ncu-rep" --page source --print-source sass --csv > "$rep.csv" 2>"$rep.err" ||
    ncu -i "$rep.ncu-rep" --page source --csv > "$rep.csv" 2>>"$rep.err"
  python3 benchmarks/tuning/common/ncu_hot.py "$rep.csv" 50 > "$rep.txt" 2>&1
  head -c 6000 "$rep.txt"; tail -3 "$rep.err"
  rm -f "$rep.ncu-rep"
done
