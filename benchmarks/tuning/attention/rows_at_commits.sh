#!/usr/bin/env bash
# Bench rows of earlier commits next to the working tree's, in one lease (a regression's bisection).
# The GPU machine gets no .git, so the commits travel as archives in the git-ignored .bisect/:
#   here:       bash benchmarks/tuning/attention/rows_at_commits.sh pack 0bbf245 bcad72b
#   the device: (run with carry [".bisect"], after a build of the working tree)
#               ROWS="sliding 512;causal" FLAGS=--bwd-only bash benchmarks/tuning/attention/rows_at_commits.sh run
# Each archive is built in place under /tmp/bisect/<commit> (16 jobs, ~80 s) and its own
# attention_cases.py times the rows there (FLAGS only where that script knows them); then the working
# tree's rows, for the same-run comparison.
set -uo pipefail
cd "$(dirname "$0")/../../.."
case "${1:-}" in
pack)
  shift
  grep -qx "/.bisect/" .git/info/exclude 2>/dev/null || echo "/.bisect/" >> .git/info/exclude
  mkdir -p .bisect
  for c in "$@"; do
    git archive --format=tar.gz -o ".bisect/$c.tar.gz" "$c" csrc opforge benchmarks setup.py pyproject.toml
  done
  du -sh .bisect ;;
run)
  IFS=';' read -ra rows <<< "${ROWS:?}"
  for f in .bisect/*.tar.gz; do
    c=$(basename "$f" .tar.gz) d=/tmp/bisect/$c
    rm -rf "$d" && mkdir -p "$d" && tar xzf "$f" -C "$d"
    (cd "$d" && MAX_JOBS=16 python3 setup.py build_ext --inplace > build.log 2>&1) || { echo "$c: build failed"; tail -5 "$d/build.log"; continue; }
    echo "== $c"
    # (the commit's own attention_cases.py: under benchmarks/tuning/ itself before the per-op folders)
    cases=benchmarks/tuning/attention/attention_cases.py
    [ -f "$d/$cases" ] || cases=benchmarks/tuning/attention_cases.py
    (cd "$d" && PYTHONPATH=$d timeout 300 python3 "$cases" "${rows[@]}" ${FLAGS:-} 2>&1 | grep -v "Warn\|generate_mlir")
  done
  echo "== working tree"
  timeout 300 python3 benchmarks/tuning/attention/attention_cases.py "${rows[@]}" ${FLAGS:-} 2>&1 | grep -v "Warn\|generate_mlir" ;;
*) echo "usage: rows_at_commits.sh pack COMMIT... | run"; exit 2 ;;
esac
