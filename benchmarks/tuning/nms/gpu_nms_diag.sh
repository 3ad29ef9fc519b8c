#!/usr/bin/env bash
# NMS diagnosis on a CUDA machine: build, the nms tests, per-kernel times, and Nsight Compute's
# view (speed of light, occupancy, warp stalls) of the mask and greedy kernels at 10k clustered.
set -uo pipefail
cd "$(dirname "$0")/../../.."
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)}
OUT=${OUT:-/tmp/nms_diag}
mkdir -p "$OUT"
"$PYTHON" -m pip install -v --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
xdist=$("$PYTHON" -c 'import xdist' 2>/dev/null && echo "-n 8")
timeout 60 "$PYTHON" -m pytest tests/test_nms.py -q -m cuda -p no:cacheprovider $xdist > "$OUT/tests_nms_cuda.log" 2>&1
tail -1 "$OUT/tests_nms_cuda.log"
timeout 30 "$PYTHON" benchmarks/tuning/nms/nms_profile.py 10000 2>&1 | grep -A4 "== nms" | tee "$OUT/profile.txt"
cat > /tmp/nms_once.py <<'PY'
import torch, opforge
from opforge.bench.nms import clustered_boxes
b, s = clustered_boxes(10000, device="cuda")
for _ in range(3):
    opforge.nms(b, s, 0.5)
torch.cuda.synchronize()
PY
timeout 90 ncu --clock-control none --kernel-name regex:"nms_(mask|greedy|rank)" --launch-skip 6 --launch-count 3 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
  "$PYTHON" /tmp/nms_once.py > "$OUT/ncu.txt" 2>&1
grep -E "nms_|Duration|Throughput|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Block Size|Grid Size|Registers|Stall|Est. Speedup|smsp__pcsamp" "$OUT/ncu.txt" | head -60
