#!/usr/bin/env bash
# The main job on the built-in tiny default: set up, build, and run `train` with 1 teacher rank
# and 2 student ranks. Usage: bash launch/quickstart.sh [RUN_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the main job runs: the program, not the tests and benchmarks (bash launch/test.sh
# builds those).
BUILD_TARGET=wan-distill bash launch/setup.sh cpu
RUN_DIR=${1:-runs/tiny}
bash launch/mpirun.sh -np 3 "${BUILD_DIR:-build}/src/app/wan-distill" train --run-dir "$RUN_DIR"
echo "quickstart: student in $RUN_DIR/student, metrics in $RUN_DIR/metrics.jsonl"
