#!/usr/bin/env bash
# Fuzzes the safetensors parser: builds fuzz_safetensors (clang, libFuzzer + ASan/UBSan) in
# build-fuzz, runs it on a copy of tests/fuzz/corpus for SECONDS, fails on any finding.
# Usage: bash launch/fuzz.sh [SECONDS=60]   (FUZZ_BUILD_DIR, JOBS and FUZZ_ARGS may be set)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
build=${FUZZ_BUILD_DIR:-build-fuzz}
findings="$build/findings"

CC=clang CXX=clang++ cmake -S . -B "$build" -DWD_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"${JOBS:-$(nproc)}" --target fuzz_safetensors

# The fuzzer adds inputs to its corpus directory; a copy keeps the repository unchanged.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r tests/fuzz/corpus/safetensors "$work/corpus"
rm -rf "$findings"
mkdir -p "$findings"

echo "fuzz: $build/tests/fuzz/fuzz_safetensors for ${seconds}s on $(ls "$work/corpus" | wc -l) seeds"
set +e
# shellcheck disable=SC2086  # FUZZ_ARGS is a list of extra libFuzzer flags
"$build/tests/fuzz/fuzz_safetensors" "$work/corpus" -dict=tests/fuzz/safetensors.dict \
  -max_total_time="$seconds" -max_len=8192 -timeout=10 -print_final_stats=1 \
  -artifact_prefix="$findings/" ${FUZZ_ARGS:-} >"$work/log" 2>&1
rc=$?
set -e
# The last status lines, the final statistics and any report; the full log is long.
{ grep -E '^#[0-9]+[[:space:]]+INITED' "$work/log" || true; } | head -1
{ grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|REDUCE|NEW)' "$work/log" || true; } | tail -2
sed -n '/^==[0-9]*==ERROR\|FINDING\|^stat::/p' "$work/log"

done_line=$({ grep -E '^#[0-9]+[[:space:]]+DONE' "$work/log" || true; } | tail -1)
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log")
cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")
ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$done_line")
corpus=$(ls "$work/corpus" | wc -l)
artifacts=$(find "$findings" -type f | wc -l)
if [[ $rc -ne 0 || $artifacts -ne 0 ]]; then
  echo "fuzz: FAILED (exit $rc): $artifacts finding(s) kept in $findings/:"
  for f in "$findings"/*; do [[ -f $f ]] && echo "  $f: $(base64 -w0 "$f" | head -c 400)"; done
  echo "fuzz: reproduce with $build/tests/fuzz/fuzz_safetensors <file>; full log follows"
  tail -n 60 "$work/log"
  exit 1
fi
echo "fuzz: PASS, ${execs:-?} executions in ${seconds}s (${rate:-?} exec/s), cov ${cov:-?}" \
     "ft ${ft:-?}, corpus ${corpus} inputs (seeds included), 0 findings"
