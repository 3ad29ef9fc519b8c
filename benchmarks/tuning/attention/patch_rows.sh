#!/usr/bin/env bash
# A kernel experiment kept as a patch (benchmarks/tuning/*.patch) timed against the working tree in
# one lease, after gpu_attention.sh's build: the tree's rows, then the patch applied (over the files
# in BASE_FILES, a folder, when given: the device gets no .git to check an older version out),
# rebuilt in place (ninja: the translation units it touches), a test subset and the same rows; then
# the tree restored and rebuilt.
#   PATCH=benchmarks/tuning/attention/seg_cols_unrolled.patch ROWS="16 packed causal documents" FLAGS=--fwd-only \
#   TESTS_K="forward_more_work or staged" bash benchmarks/tuning/attention/patch_rows.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
IFS=';' read -ra rows <<< "${ROWS:?}"
run_rows() { timeout 300 python3 benchmarks/tuning/attention/attention_cases.py "${rows[@]}" ${FLAGS:-} 2>&1 | grep -v "Warn\|generate_mlir"; }
echo "== working tree"; run_rows
files=$(grep '^+++ b/' "${PATCH:?}" | sed 's#^+++ b/##')
mkdir -p /tmp/patch_rows_orig && for f in $files; do cp "$f" "/tmp/patch_rows_orig/$(basename "$f")"; done
[ -n "${BASE_FILES:-}" ] && for f in $files; do [ -f "$BASE_FILES/$(basename "$f")" ] && cp "$BASE_FILES/$(basename "$f")" "$f"; done
# (A failed build stops the run: rows of a stale library mislead.)
build() { MAX_JOBS=16 python3 setup.py build_ext --inplace > /tmp/patch_rows_build.log 2>&1 ||
  { grep -m5 -A5 error /tmp/patch_rows_build.log; tail -5 /tmp/patch_rows_build.log; exit 1; }; }
if git apply "$PATCH" 2>/dev/null || patch -p1 -s < "$PATCH"; then
  build
  if [ -n "${TESTS_K:-}" ]; then
    timeout 200 python3 -m pytest tests/test_attention_cuda.py -q -n 8 -p no:cacheprovider -k "$TESTS_K" 2>&1 | tail -2
  fi
  echo "== $PATCH"; run_rows
else
  echo "$PATCH does not apply"
fi
for f in $files; do cp "/tmp/patch_rows_orig/$(basename "$f")" "$f"; done
# (NO_RESTORE=1: the tree's build is not needed after this: skip rebuilding it)
[ "${NO_RESTORE:-0}" = 1 ] || build
