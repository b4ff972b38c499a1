#!/usr/bin/env bash
# Runs the test suite (what CI runs): set up and build if needed, then every CTest test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
# One BLAS / OpenMP thread per process: tests run ranks side by side on few cores.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure --timeout 600 "$@"
