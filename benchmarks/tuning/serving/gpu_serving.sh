#!/usr/bin/env bash
# Issue 47's serving work on the H200 in one lease: three runs back to back (the machine keeps ignored
# build outputs and /root while it stays warm, ~30 s). Logs under $OUT (default /tmp/serving). Pass
# OPFORGE_COMMIT=<sha> literally in each run's command: the device's .git is not the tree measured
# (`git rev-parse` there named the session's base commit), and the bench stamps its results with it.
#   here:   bash ../shared/tools/flashinfer_peer.sh prepare          (.fi_a, .fi_b)
#   run 1:  (carry [".fi_a"]) bash benchmarks/tuning/serving/gpu_serving.sh build
#           FlashInfer's first part to /root/fi; the tree built in place (16 jobs); the CUDA tests
#           (pytest -m cuda, 8 workers; TESTS=0 skips them); the decode grid's GRID_ROWS (default
#           core,ragged,paged) against SDPA; Nsight Compute on the NCU rows (decode_grid ids; default
#           the ragged B8 x 32k row and the B8 x 32k row, opforge's decode kernel)
#   run 2:  (carry [".fi_b"]) bash benchmarks/tuning/serving/gpu_serving.sh peers
#           FlashInfer installed, then `opforge bench --ops serving` (BENCH_FULL=1: --full) with it;
#           the decode kernel's traits and splits (decode_variants.py; VARIANTS=0 skips it)
#   run 3:  (carry [".tf525"]) bash benchmarks/tuning/serving/gpu_serving.sh cb
#           the continuous-batching row (serving_row.py: opforge against sdpa) on transformers 5.17 and 5.25
#           (5.17 also with CUDA graphs asked for; CB_PROFILE=1: profiler tables and traces for 5.17)
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/serving}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
case "${1:-}" in
build)
  [ -d .fi_a ] && mkdir -p /root/fi && cp .fi_a/* /root/fi/
  { date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit ${OPFORGE_COMMIT:-?}"
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } > "$OUT/env.txt" 2>&1
  start=$(date +%s)
  MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  echo "built in $(( $(date +%s) - start )) s"
  if [ "${TESTS:-1}" = 1 ]; then
    timeout "${TEST_TIMEOUT:-200}" python3 -m pytest tests -m cuda -q -n 8 -p no:cacheprovider ${TESTS_K:+-k "$TESTS_K"} > "$OUT/tests.log" 2>&1
    echo "tests: rc $?"; grep -E "^FAILED|^ERROR| passed| failed" "$OUT/tests.log" | head -30
  fi
  timeout "${GRID_TIMEOUT:-240}" python3 benchmarks/tuning/attention/decode_grid.py --rows "${GRID_ROWS:-core,ragged,paged}" \
    --json "$OUT/grid.json" 2>&1 | grep -v Warn | tee "$OUT/grid.txt"
  metrics=dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active,sm__cycles_active.avg,sm__cycles_active.max,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
  for row in ${NCU:-33 7}; do
    # (the sections say where the decode loop's time goes: issue slots, warp stall reasons, memory)
    timeout 100 ncu --clock-control none --kernel-name regex:decode --launch-skip 2 --launch-count 2 --metrics "$metrics" \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      python3 benchmarks/tuning/attention/decode_grid.py --one "$row" --impl opforge > "$OUT/ncu_$row.txt" 2>&1
    echo "== ncu row $row"; grep -E "attention_decode|dram__|gpu__time|launch__|sm__|smsp__|Stall|Issue|Eligible|Throughput" "$OUT/ncu_$row.txt" | sed 's/(opforge::[^)]*)//' | cut -c1-150
  done ;;
peers)
  [ -d .fi_b ] && { bash .fi_b/flashinfer_peer.sh install || echo "FlashInfer install failed"; }
  export PYTHONPATH=$PWD:/root/fi_site FLASHINFER_WORKSPACE_BASE=/root/fi_ws OPFORGE_COMMIT=${OPFORGE_COMMIT:-?}
  timeout "${BENCH_TIMEOUT:-420}" python3 -m opforge.bench --device cuda --ops serving ${BENCH_FULL:+--full} --out "$OUT/bench" \
    > "$OUT/bench.txt" 2>&1
  echo "bench: rc $?"; grep -vE "Warn|^\s*$" "$OUT/bench.txt" | tail -40
  if [ "${VARIANTS:-1}" = 1 ]; then
    timeout "${VARIANTS_TIMEOUT:-240}" python3 benchmarks/tuning/attention/decode_variants.py > "$OUT/variants.txt" 2>&1
    echo "variants: rc $?"; grep -v Warn "$OUT/variants.txt" | tail -80
  fi ;;
cb)
  # transformers 5.17 (installed there) and 5.25 (its wheels, .tf525: pip download of transformers==5.25.0
  # and kernels==0.19.1 with their dependencies for Python 3.12, numpy left out) in turn
  # (5.17: also "paged|opforge" with CUDA graphs asked for, which 5.17 gives only flash names by default)
  timeout "${CB_TIMEOUT:-270}" python3 benchmarks/tuning/serving/serving_row.py \
    --impls "paged|opforge,paged|opforge+graphs,sdpa" ${CB_PROFILE:+--profile "$OUT/cb_traces"} > "$OUT/cb_517.txt" 2>&1
  echo "5.17: rc $?"; grep -vE "Warn|WARNING" "$OUT/cb_517.txt" | tail -4
  if [ -d .tf525 ]; then
    python3 -m pip install -q --no-index --no-deps --target /root/tf525 .tf525/*.whl > /dev/null 2>&1 || echo "5.25 wheels: install failed"
    PYTHONPATH=/root/tf525:$PWD timeout "${CB_TIMEOUT:-270}" python3 benchmarks/tuning/serving/serving_row.py > "$OUT/cb_525.txt" 2>&1
    echo "5.25: rc $?"; grep -vE "Warn|WARNING" "$OUT/cb_525.txt" | tail -4
  fi ;;
*) sed -n '2,16p' "$0"; exit 2 ;;
esac
