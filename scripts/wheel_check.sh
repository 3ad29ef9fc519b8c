#!/usr/bin/env bash
# The CPU wheel as a colleague gets it: `make wheel` with OPFORGE_CUDA=0, installed with the torch
# it pins into a fresh virtual environment, then scripts/wheel_smoke.py run there from outside the
# source tree, with no compiler on PATH and nothing of this shell's environment. Used by CI.
# Everything lives in a temporary folder, removed at the end (dist/ is left alone).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
repo=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

OPFORGE_CUDA=0 make wheel PYTHON="$PYTHON" DIST="$work/dist"
wheel=$(ls "$work"/dist/opforge-*.whl)
echo "wheel: $(basename "$wheel")"

# The torch release this one is; pip takes it from its cache or index. Both in one install, so a
# pin that the torch can't satisfy fails here instead of replacing it.
torch=$("$PYTHON" -c 'import torch; print(torch.__version__.split("+")[0])')
"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet "torch==$torch" "$wheel"

cd "$work"
env -i HOME="$HOME" PATH="$work/venv/bin" CC=/nonexistent CXX=/nonexistent \
  "$work/venv/bin/python" "$repo/scripts/wheel_smoke.py"
