#!/usr/bin/env bash
# Matmul tuning on the GPU without the extension build: the tensor-core ceilings
# (benchmarks/tuning/tensor_peak.cu), the rungs' configurations against cuBLAS
# (benchmarks/tuning/matmul_tune.py), and Nsight Compute on chosen configurations. Logs under $OUT.
#   TUNE="warp_tiled:1,4 wgmma:1,2" NCU="wgmma:1 wgmma:2" bash scripts/gpu_tune.sh
#   TRACE=1: the mma default's timeline (matmul_tune.py --trace); TRACE="39 75": tracing configurations
#   MIX=1: the mma rung's inner-loop ceilings, ingredient by ingredient (benchmarks/tuning/mma_mix.cu)
#   POWER="cublas,mma:74,mix:bk96": sustained rates, clock and board power (work per joule at the cap)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/tune}
mkdir -p "$OUT"
if [ -z "${NOPEAK:-}" ]; then
  nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I csrc -o "$OUT/peak" benchmarks/tuning/tensor_peak.cu &&
    timeout 60 "$OUT/peak" 2>&1 | tee "$OUT/peak.log"
  rm -f "$OUT/peak"
fi
if [ -n "${MIX:-}" ]; then
  nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I csrc -o "$OUT/mix" benchmarks/tuning/mma_mix.cu &&
    timeout 60 "$OUT/mix" 2>&1 | tee "$OUT/mix.log"
  rm -f "$OUT/mix"
fi
for spec in ${TUNE:-}; do
  rung=${spec%%:*} configs=${spec#*:}
  timeout ${TUNE_TIMEOUT:-150} python3 benchmarks/tuning/matmul_tune.py ${QUICK:+--quick} --only "$rung" --configs "$configs" 2>&1 |
    grep -v Warning | tee -a "$OUT/tune.log"
done
# POWER="cublas,mma:74,mix:bk96": each sustained 4 s at bf16 4096^3 with nvidia-smi sampling (work per joule at the cap).
for items in ${POWER:-}; do
  timeout 240 python3 benchmarks/tuning/matmul_tune.py --power "$items" 2>&1 | grep -v Warning | tee -a "$OUT/power.log"
done
# TRACE=1: configuration 75 (the default, traced); TRACE="39 75": those tracing configurations, one log each.
for cfg in ${TRACE:-}; do
  [ "$cfg" = 1 ] && cfg=75
  timeout 150 python3 benchmarks/tuning/matmul_tune.py --trace "$cfg" 2>&1 | grep -v Warning | tee "$OUT/trace-$cfg.log"
done
for spec in ${NCU:-}; do
  timeout 120 ncu --clock-control none --kernel-name regex:matmul_ --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section LaunchStats --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis_Tables --section Occupancy \
    --metrics smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,lts__t_bytes.sum.per_second,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum \
    python3 benchmarks/tuning/matmul_tune.py --profile "$spec" > "$OUT/ncu-${spec/:/-}.txt" 2>&1
  grep -E "Duration|Throughput|Grid Size|stalled|pipe|conflicts|lts__|wavefronts|Issue|Registers" "$OUT/ncu-${spec/:/-}.txt" | head -60
done
# Source-level stall sampling: SRC="mma:9" -> the hottest SASS lines (benchmarks/tuning/ncu_hot.py).
for spec in ${SRC:-}; do
  rep="$OUT/src-${spec/:/-}"
  timeout 150 ncu --clock-control none --kernel-name regex:matmul_ --launch-skip 1 --launch-count 1 \
    --section SourceCounters --section WarpStateStats -o "$rep" -f \
    python3 benchmarks/tuning/matmul_tune.py --profile "$spec" > "$rep.log" 2>&1
  ncu -i "$rep.ncu-rep" --page source --print-source sass --csv > "$rep.csv" 2>"$rep.err" ||
    ncu -i "$rep.ncu-rep" --page source --csv > "$rep.csv" 2>>"$rep.err"
  python3 benchmarks/tuning/ncu_hot.py "$rep.csv" 50 > "$rep.txt" 2>&1
  head -c 6000 "$rep.txt"; tail -3 "$rep.err"
  rm -f "$rep.ncu-rep"
done
