#!/usr/bin/env bash
# Builds the data tests with AddressSanitizer in build-asan and runs them (what CI runs after
# the main tests). Usage: bash launch/asan.sh [ctest args]   (ASAN_BUILD_DIR, JOBS may be set)
set -euo pipefail
cd "$(dirname "$0")/.."

build=${ASAN_BUILD_DIR:-build-asan}
targets=(test_data)

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DWD_SANITIZE=address -DWD_BUILD_BENCH=OFF \
  >/dev/null
cmake --build "$build" -j"${JOBS:-$(nproc)}" --target "${targets[@]}"

# LibTorch, OpenBLAS, HDF5 and MPI are prebuilt without ASan; our code (and the Torch headers
# it inlines) is instrumented, and libasan is linked first, so it intercepts every malloc.
# Checked on Debian 12 (gcc 12, LibTorch 1.13.1): test_data passes with ASan's defaults,
# LeakSanitizer included, so nothing is switched off. Should a LibTorch update bring reports
# that are not ours, these are the known switches, and why:
#   detect_leaks=0            LibTorch/OpenBLAS keep process-lifetime pools that LeakSanitizer
#                             may count as leaks at exit (it also cannot run under ptrace).
#   alloc_dealloc_mismatch=0  memory allocated in an uninstrumented library and freed by
#                             inlined header code (or the reverse) can look like new[]/free.
#   protect_shadow_gap=0      only for a CUDA LibTorch: the CUDA driver maps memory there.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
regex="^($(IFS='|'; echo "${targets[*]}"))\$"
ctest --test-dir "$build" -R "$regex" --output-on-failure --timeout 600 "$@"
