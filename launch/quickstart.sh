#!/usr/bin/env bash
# The main job on the built-in tiny default: set up, build, create a tiny teacher, run it.
# Until the distributed `train` exists this is the `forward` of a freshly initialised tiny DiT.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
BIN=${BUILD_DIR:-build}/src/app/wan-distill
OUT=${OUT_DIR:-out}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
"$BIN" init-teacher --preset tiny --output "$OUT/tiny-teacher" --overwrite
"$BIN" inspect "$OUT/tiny-teacher"
"$BIN" forward --weights "$OUT/tiny-teacher" --latent 1,3,16,16 --output "$OUT/tiny-forward.safetensors"
