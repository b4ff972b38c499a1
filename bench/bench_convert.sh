#!/usr/bin/env bash
# Time and peak RSS of `wan-distill convert` (fp32 -> bf16) on random fp32 checkpoints made
# with init-teacher, at several shard sizes. Prints a markdown table.
#   bench/bench_convert.sh [BUILD_DIR] [WORK_DIR]
# SIZES="small big" picks the checkpoints: small = 1.48 GiB, big = 7.67 GiB (needs ~12 GiB of
# disk in WORK_DIR while it runs). Everything written is removed at the end.
set -euo pipefail
BUILD_DIR=${1:-build}
WORK=${2:-/tmp/wd-bench-convert}
SIZES=${SIZES:-small big}
CLI="$BUILD_DIR/src/app/wan-distill"
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT

peak_kib() { grep "Maximum resident set size" "$1" | awk '{print $NF}'; }
wall() { grep "Elapsed (wall clock)" "$1" | awk '{print $NF}'; }

echo "| input | shards in | --shard-size | output | wall | peak RSS |"
echo "|---|---|---:|---|---:|---:|"
for size in $SIZES; do
  case $size in
    small) model="--dim 1536 --ffn-dim 8960 --num-heads 12 --num-layers 8"; in_shard=500MB ;;
    big) model="--dim 2048 --ffn-dim 8192 --num-heads 16 --num-layers 30"; in_shard=5GB ;;
  esac
  rm -rf "$WORK/in"
  # shellcheck disable=SC2086
  "$CLI" init-teacher --preset tiny $model --text-dim 4096 --freq-dim 256 --dtype fp32 \
    --shard-size "$in_shard" --output "$WORK/in" --log.level warn
  in_bytes=$(du -sb "$WORK/in" | cut -f1)
  in_files=$(ls "$WORK/in" | grep -c '\.safetensors$')
  "$CLI" inspect "$WORK/in" > /dev/null  # the page cache holds the input for every run alike
  /usr/bin/time -v "$CLI" inspect "$WORK/in" > /dev/null 2> "$WORK/base.log"
  for shard in 5GB 1GB 200MB 50MB; do
    rm -rf "$WORK/out"
    /usr/bin/time -v "$CLI" convert --input "$WORK/in" --output "$WORK/out" --dtype bf16 \
      --shard-size "$shard" 2> "$WORK/conv.log"
    out_bytes=$(du -sb "$WORK/out" | cut -f1)
    out_files=$(ls "$WORK/out" | grep -c '\.safetensors$')
    printf "| %s fp32 (%.2f GiB) | %d | %s | %d file(s), %.2f GiB | %s | %.0f MiB |\n" "$size" \
      "$(echo "$in_bytes / 1073741824" | bc -l)" "$in_files" "$shard" "$out_files" \
      "$(echo "$out_bytes / 1073741824" | bc -l)" "$(wall "$WORK/conv.log")" \
      "$(echo "$(peak_kib "$WORK/conv.log") / 1024" | bc -l)"
  done
  printf "| (baseline: \`inspect\` of the same input) | | | | | %.0f MiB |\n" \
    "$(echo "$(peak_kib "$WORK/base.log") / 1024" | bc -l)"
  rm -rf "$WORK/in" "$WORK/out"
done
