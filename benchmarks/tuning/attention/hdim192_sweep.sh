#!/usr/bin/env bash
# The head-dim-192 forward's traits compared in one lease: each variant ("|"-separated sed expressions
# on attention_fwd_hopper_traits.cuh, variants separated by ";", the first usually empty: the header as
# it is) rebuilt in place (16 jobs) and timed on issue48_rows.py's 192 rows (forward, opforge and cuDNN
# as the fixed point). The header is restored at the end. Logs under $OUT.
#   VARIANTS=";s/<192, 128, 2, 2, true,/<192, 128, 2, 2, false,/|s/<192, 96, 2, 2, true,/<192, 96, 2, 2, false,/"
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/sweep}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
header=csrc/attention/cuda/attention_fwd_hopper_traits.cuh
cp "$header" /tmp/sweep_header.orig
IFS=';' read -ra variants <<< "${VARIANTS:-}"
i=0
for v in "${variants[@]}" ; do
  cp /tmp/sweep_header.orig "$header"
  IFS='|' read -ra exprs <<< "$v"
  for e in "${exprs[@]}"; do [ -n "$e" ] && sed -i "$e" "$header"; done
  echo "== variant $i: ${v:-as committed}"; grep -n "^using HopperFwdTraits.*D192" "$header"
  start=$(date +%s)
  MAX_JOBS=16 python3 setup.py build_ext --inplace > "$OUT/build_$i.log" 2>&1 || { grep -m5 -A3 "error" "$OUT/build_$i.log"; i=$((i + 1)); continue; }
  echo "built in $(( $(date +%s) - start )) s"
  timeout 150 python3 benchmarks/tuning/attention/issue48_rows.py --rows mla,hdim --peers opforge,cuDNN --fwd-only 2>&1 \
    | grep -v "Warn\|D96" | tee "$OUT/rows_$i.txt"
  i=$((i + 1))
done
cp /tmp/sweep_header.orig "$header"
