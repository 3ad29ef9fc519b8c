#!/usr/bin/env bash
# Hopper kernel configurations compared in one lease (after gpu_attention.sh's build): each variant
# rewrites one `using ...Traits... = ...;` line of the kernel header (HEADER, default the forward's;
# the backward's: HEADER=csrc/attention/cuda/attention_bwd_hopper_traits.cuh FWD_ONLY=0), rebuilds in place
# (ninja: only the translation units that include it) and times the rows (attention_cases.py,
# forward only, with their peers). The header is restored at the end.
#   VARIANTS="HopperFwdTraitsD64 = HopperFwdTraits<64, 128, 2, 3>;HopperFwdTraitsD64 = HopperFwdTraits<64, 128, 2, 2>"
#   (the lines' trailing semicolons left out: ';' separates the variants)
#   ROWS="causal D64;sliding 512 D64"
set -uo pipefail
cd "$(dirname "$0")/../../.."
header=${HEADER:-csrc/attention/cuda/attention_fwd_hopper_traits.cuh}
cp "$header" /tmp/sweep_header.orig
IFS=';' read -ra variants <<< "${VARIANTS:?}"
IFS=';' read -ra rows <<< "${ROWS:?}"
for v in "${variants[@]}"; do
  [ -n "$v" ] || continue
  name=${v%% =*}
  sed -i "s|^using ${name} = .*|using ${v};|" "$header"
  grep -n "^using ${name} " "$header"
  MAX_JOBS=16 python3 setup.py build_ext --inplace > /tmp/sweep_build.log 2>&1 || { grep -m5 -A3 "error" /tmp/sweep_build.log; break; }
  timeout 200 python3 benchmarks/tuning/attention/attention_cases.py "${rows[@]}" $([ "${FWD_ONLY:-1}" = 1 ] && echo --fwd-only) 2>&1 | grep -v "Warn\|generate_mlir"
done
cp /tmp/sweep_header.orig "$header"
