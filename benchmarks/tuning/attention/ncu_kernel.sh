#!/usr/bin/env bash
# Nsight Compute on one launch of one kernel in a bench row (attention_cases.py --opforge-only, or
# --impl=NAME in the flags for a peer's):
# the speed-of-light, warp-state and occupancy sections plus the tuning metrics, then source-level
# stall sampling of the same launch (the hottest SASS lines, ncu_hot.py). Run after a build.
#   bash benchmarks/tuning/attention/ncu_kernel.sh "causal" attention_bwd_hopper_kernel 1 [out_dir] [extra attention_cases flags]
set -uo pipefail
cd "$(dirname "$0")/../../.."
row=$1 kernel=$2 skip=${3:-1} out=${4:-/tmp} flags=${5:-}
case "$flags" in *--impl=*) ;; *) flags="--opforge-only $flags" ;; esac
metrics=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,lts__t_bytes.sum.per_second,smsp__inst_executed.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__throughput.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__cycles_active.avg
tag=$(echo "$row-$kernel" | tr -c 'A-Za-z0-9_-' '_')
timeout 240 ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip "$skip" --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --metrics "$metrics" \
  python3 benchmarks/tuning/attention/attention_cases.py "$row" $flags > "$out/ncu_$tag.txt" 2>&1
grep -E "attention_|Backward|Forward|kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|gmma|stalled|conflicts|lts__t|Registers Per|Achieved Occ|local_op|inst_executed.sum|l1tex__|cycles_active" "$out/ncu_$tag.txt" | grep -v "^==PROF" | head -40
timeout 240 ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip "$skip" --launch-count 1 \
  --section SourceCounters --section WarpStateStats -o "/tmp/src_$tag" -f \
  python3 benchmarks/tuning/attention/attention_cases.py "$row" $flags > "/tmp/src_$tag.log" 2>&1
ncu -i "/tmp/src_$tag.ncu-rep" --page source --print-source sass --csv > "/tmp/src_$tag.csv" 2>/dev/null
python3 benchmarks/tuning/common/ncu_hot.py "/tmp/src_$tag.csv" 45 > "$out/src_$tag.txt" 2>&1
head -c 9000 "$out/src_$tag.txt"
