#!/usr/bin/env bash
# Matmul tuning on the GPU without the extension build: the tensor-core ceilings
# (benchmarks/micro/tensor_peak.cu), the rungs' configurations against cuBLAS
# (benchmarks/micro/matmul_tune.py), and Nsight Compute on chosen configurations. Logs under $OUT.
#   TUNE="warp_tiled:1,4 wgmma:1,2" NCU="wgmma:1 wgmma:2" bash scripts/gpu_tune.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tune}
mkdir -p "$OUT"
nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I csrc -o "$OUT/peak" benchmarks/micro/tensor_peak.cu &&
  timeout 60 "$OUT/peak" 2>&1 | tee "$OUT/peak.log"
rm -f "$OUT/peak"
for spec in ${TUNE:-}; do
  rung=${spec%%:*} configs=${spec#*:}
  timeout ${TUNE_TIMEOUT:-150} python3 benchmarks/micro/matmul_tune.py ${QUICK:+--quick} --only "$rung" --configs "$configs" 2>&1 |
    grep -v Warning | tee -a "$OUT/tune.log"
done
for spec in ${NCU:-}; do
  timeout 120 ncu --clock-control none --kernel-name regex:matmul_ --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section LaunchStats \
    --metrics lts__t_bytes.sum.per_second,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum \
    python3 benchmarks/micro/matmul_tune.py --profile "$spec" > "$OUT/ncu-${spec/:/-}.txt" 2>&1
  grep -E "Duration|Throughput|Grid Size|Stall|lts__|wavefronts|Issued Ipc|Registers" "$OUT/ncu-${spec/:/-}.txt" | head -40
done
