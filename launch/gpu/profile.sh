#!/usr/bin/env bash
# all.sh's `profile` step (issue 46): where a teacher forward's time goes and what streaming its
# blocks costs, in one pass on the lent GPU, summarised in one file.
#   1. bench_forward at TI2V-5B dims, bf16, 8190 tokens: median forward and MFU; each block timed
#      on its own; one more forward under LibTorch's Kineto profiler: its top 25 CUDA kernels,
#      their time by category (attention, GEMM, norms, elementwise: RoPE, modulation, gates;
#      GELU, copies) per forward and per block; the Chrome trace.
#   2. bench_stream at real block dims (random bf16 teachers of 6 TI2V-5B blocks, 4 A14B blocks):
#      the pinned host-to-device bandwidth, resident against streamed from the pinned arena
#      (ahead 1 and 2) at 8190 tokens and, for TI2V-5B, 27,280 (720p); the fallback (no arena,
#      4 copy threads over the mapped checkpoint); per block the staging, upload and wait times;
#      plan's predicted ratio beside the measured one.
# Writes into OUT_DIR: profile.md (the summary: every table above, in order), profile.trace.json,
# and prints everything (stdout: all.sh's profile.log); its last line, "profile: ...", holds the
# key figures. Each part runs under its own `timeout`; one that fails is reported and the next runs.
# Usage: BUILD_DIR=build-gpu OUT_DIR=DIR [PEAK_TFLOPS=989] bash launch/gpu/profile.sh
set -uo pipefail
build=${BUILD_DIR:?BUILD_DIR is the CUDA build tree}
dir=${OUT_DIR:?OUT_DIR is where profile.md goes}
peak=${PEAK_TFLOPS:-989}
part_timeout=${PROFILE_PART_TIMEOUT:-150}
md=$dir/profile.md
mkdir -p "$dir"
lat480=(--frames 21 --height 30 --width 52)  # 8190 tokens: TI2V-5B at 832x480x81 (batch 1)
lat720=(--frames 31 --height 44 --width 80)  # 27,280 tokens: TI2V-5B at 1280x704x121

{
  echo "# Profile of a teacher forward and of block streaming (launch/gpu/profile.sh)"
  echo
  echo "- $(date -u '+%Y-%m-%d %H:%M:%S UTC'); GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "- PEAK_TFLOPS=$peak (dense bf16, for MFU)"
} >"$md"

# part TITLE PROGRAM ARGS...: runs a benchmark under its timeout, its output into profile.md.
part() {
  local title=$1 prog=$2
  shift 2
  {
    echo
    echo "## $title"
    echo
    echo "\`$(basename "$prog") $*\`"
    echo
  } >>"$md"
  if [[ ! -x $prog ]]; then
    echo "not run: $prog not built" | tee -a "$md"
    return
  fi
  timeout -k 10 "$part_timeout" "$prog" "$@" 2>&1 | tee -a "$md"
  local rc=${PIPESTATUS[0]}
  ((rc == 0)) || echo "(exit $rc$( ((rc == 124)) && echo ": timed out after ${part_timeout} s"))" | tee -a "$md"
}

part "Forward at TI2V-5B dims, 8190 tokens, bf16: kernels and blocks" "$build/bench/bench_forward" \
  --device cuda --sizes wan22-ti2v-5b --dtypes bf16 --threads 1 "${lat480[@]}" --warmup 2 --runs 3 \
  --peak-tflops "$peak" --profile-top 25 --profile-trace "$dir/profile.trace.json"
stream=("$build/bench/bench_stream" --device cuda --batch 1 --runs 3)
part "Stream: TI2V-5B blocks, 8190 tokens, from the pinned arena" "${stream[@]}" --preset wan22-ti2v-5b --blocks 6 "${lat480[@]}"
part "Stream: TI2V-5B blocks, 27,280 tokens (720p), from the pinned arena" "${stream[@]}" --preset wan22-ti2v-5b --blocks 6 "${lat720[@]}" --aheads 2
part "Stream: TI2V-5B blocks, 8190 tokens, no arena (4 copy threads over the mapped checkpoint)" "${stream[@]}" \
  --preset wan22-ti2v-5b --blocks 6 "${lat480[@]}" --arena-limit 0 --copy-threads 4 --aheads 2
part "Stream: T2V-A14B blocks, 8190 tokens, from the pinned arena" "${stream[@]}" --preset wan22-t2v-a14b --blocks 4 "${lat480[@]}"

# The key figures, for all.sh's summary row.
h2d=$(grep -m1 -oE 'pinned host-to-device: [0-9.]+ GB/s' "$md" | grep -oE '[0-9.]+ GB/s')
fwd=$(grep -m1 -E '^\| wan22-ti2v-5b ' "$md" | awk -F'|' '{ gsub(/ /, "", $7); gsub(/ /, "", $12); print $7 " ms, MFU " $12 }')
ratios=$(grep -E '^\| stream \| 2 \|' "$md" | awk -F'|' '{ gsub(/ /, "", $5); gsub(/ /, "", $12); printf "%s%sx (plan %sx)", (NR > 1 ? ", " : ""), $5, $12 }')
top=$(grep -m1 -E '^\| 1 \| `' "$md" | awk -F'|' '{ gsub(/^ +| +$|`/, "", $3); gsub(/^ +| +$/, "", $7); print substr($3, 1, 60) " " $7 }')
echo "profile: H2D ${h2d:-?}; 5B forward ${fwd:-?}; stream ahead 2 (5B 480p, 5B 720p, 5B no arena, A14B): ${ratios:-?}; top kernel ${top:-?}" | tee -a "$md"
