#!/usr/bin/env bash
# Decode on the GPU in one lease (issue 32): build, the decode / paged / transformers CUDA tests, the
# decode grid (decode_grid.py), Nsight Compute on chosen grid rows' kernels, the serving row. Logs under $OUT.
#   TESTS=0 GRID=0                    skip the tests / the grid
#   GRID_ROWS=core,gqa                the grid's groups
#   NCU="7|opforge|decode;7|SDPA|flash"  rows (grid ids) whose kernels ncu profiles: row|impl|kernel regex
#   SERVE=1 SERVE_ARGS="--impls paged|opforge,paged|sdpa"   the serving row
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/decode}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
status=0
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; echo "commit ${OPFORGE_COMMIT:-?}"; python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } > "$OUT/env.txt" 2>&1
start=$(date +%s)
MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
if [ "${TESTS:-1}" = 1 ]; then
  timeout 300 python3 -m pytest ${TESTS_FILES:-tests/test_attention_cuda.py tests/test_transformers_cuda.py} -q -n 8 -p no:cacheprovider -k "${TESTS_K:-paged or kv_lens or decode or transformers}" > "$OUT/tests.log" 2>&1 || status=1
  tail -3 "$OUT/tests.log"
fi
if [ "${GRID:-1}" = 1 ]; then
  timeout 400 python3 benchmarks/tuning/attention/decode_grid.py --rows "${GRID_ROWS:-core,gqa,dims,ragged,paged,prefill}" --json "$OUT/grid.json" 2>&1 | grep -v Warn | tee "$OUT/grid.txt"
fi
IFS=';' read -ra specs <<< "${NCU:-}"
metrics=dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__inst_executed.sum,lts__t_sector_hit_rate.pct,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,launch__shared_mem_per_block_static,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,sm__cycles_active.avg
for spec in "${specs[@]}"; do
  IFS='|' read -r row impl kernel <<< "$spec"
  echo "== ncu row $row $impl $kernel"
  timeout 200 ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --metrics "$metrics" \
    python3 benchmarks/tuning/attention/decode_grid.py --one "$row" --impl "$impl" > "$OUT/ncu_${row}_${impl// /_}.txt" 2>&1
  grep -E "  [a-z_]+.*(decode|flash|fmha|Kernel|kernel)|Duration|Throughput|dram__|stalled|Registers|Achieved Occ|grid_size|block_size|shared_mem|occupancy_limit|warps_active|inst_executed|hit_rate" "$OUT/ncu_${row}_${impl// /_}.txt" | grep -v "^==PROF" | head -45
done
if [ "${SERVE:-0}" = 1 ]; then
  timeout 420 python3 benchmarks/tuning/serving/serving_row.py ${SERVE_ARGS:-} 2>&1 | grep -v Warn | tee "$OUT/serving.txt"
fi
exit $status
