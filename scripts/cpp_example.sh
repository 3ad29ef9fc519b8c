#!/usr/bin/env bash
# Builds libopforge with CMake, installs its package, builds examples/cpp against the
# installed package and runs it through ctest. OPFORGE_CMAKE_CUDA=ON|OFF|AUTO (default OFF:
# the Python build already compiles the CUDA sources; this checks the C++ packaging).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_PREFIX=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')
PREFIX=${PREFIX:-$PWD/build/cmake-install}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
JOBS=${MAX_JOBS:-$(nproc)}

cmake -S . -B build/cmake "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
  -DOPFORGE_CUDA="${OPFORGE_CMAKE_CUDA:-OFF}" -DCMAKE_INSTALL_PREFIX="$PREFIX"
cmake --build build/cmake -j "$JOBS"
cmake --install build/cmake
cmake -S examples/cpp -B build/example "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PREFIX;$TORCH_PREFIX"
cmake --build build/example -j "$JOBS"
(cd build/example && ctest --output-on-failure)
