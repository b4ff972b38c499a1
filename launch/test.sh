#!/usr/bin/env bash
# Runs the test suite (what CI runs): set up and build both trees if needed, every CTest test of
# the Debian LibTorch 1.13 build (build/), the `libtorch` entries of the CUDA LibTorch 2.11 build
# (build-cuda/, on the CPU; GPU tests skip without a GPU), then the data tests under
# AddressSanitizer (launch/asan.sh) and a short fuzz run of the safetensors parser
# (launch/fuzz.sh). Each stage prints its summary; the script fails if any stage failed.
# Usage: bash launch/test.sh [ctest args]   (FUZZ_SECONDS=60, SKIP_CUDA=1, SKIP_ASAN=1,
#        SKIP_FUZZ=1 may be set)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
# build-cuda/ runs its tests on the CPU, where the work is inside LibTorch: -O1 compiles our code
# about 40% faster than -O3 (bench/results/ci.md). A GPU build (launch/gpu/build.sh) stays -O3.
export WD_CUDA_OPT=${WD_CUDA_OPT:--O1}
# No test runs the benchmark programs: build-cuda/ compiles them (the LibTorch a GPU machine
# runs them with), build/ leaves them out (about 50 s of a cold build on 2 cores).
export WD_BUILD_BENCH=${WD_BUILD_BENCH:-OFF}
if [[ -z ${SKIP_CUDA:-} ]]; then bash launch/setup.sh all; else bash launch/setup.sh cpu && bash launch/setup.sh venv; fi
echo "=== set-up and builds: $((SECONDS - start)) s"
# One BLAS / OpenMP thread per process: tests run ranks side by side on few cores.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

summary=()
failed=0
# Runs one stage, records "name: PASS|FAIL (seconds)" and carries on, so one failure does not
# hide the others.
stage() {
  local name=$1
  shift
  local start=$SECONDS rc=0
  echo "=== $name"
  "$@" || rc=$?
  local verdict=PASS
  if ((rc != 0)); then verdict="FAIL (exit $rc)"; failed=1; fi
  summary+=("$name: $verdict, $((SECONDS - start)) s")
}

# Two busy tests at a time, one per core (tests/ctest-resources.json's two `cpus` slots), and a
# third slot for the failure cases, which mostly wait out deadlines and mpirun's kill grace and
# hold no `cpus` slot (tests/CMakeLists.txt, wd_cpu_slot). Every entry has its own timeout.
ctest_args=(--output-on-failure --timeout 600 --parallel "${CTEST_PARALLEL:-3}"
  --resource-spec-file "$PWD/tests/ctest-resources.json")
stage "ctest (LibTorch 1.13 CPU build)" ctest --test-dir "${BUILD_DIR:-build}" "${ctest_args[@]}" "$@"
# The CUDA tree runs what can differ between the two LibTorch builds (label `libtorch`,
# tests/CMakeLists.txt): unit, N-rank, NCCL and reference entries and one launch case per path
# LibTorch's version can change. The rest (the failure matrix, SLURM, the Python tools, the toy
# bench, most launch cases) checks MPI, signals, scripts and arithmetic that are the same code in
# both trees: once is enough. CUDA_CTEST_ARGS replaces the selection ('-LE slurm|bench': all the rest, as before).
if [[ -z ${SKIP_CUDA:-} ]]; then
  # shellcheck disable=SC2086
  stage "ctest (LibTorch 2.11 CUDA build, on the CPU)" ctest --test-dir "${CUDA_BUILD_DIR:-build-cuda}" \
    "${ctest_args[@]}" ${CUDA_CTEST_ARGS:--L libtorch} "$@"
fi
if [[ -z ${SKIP_ASAN:-} ]]; then stage "asan data tests" bash launch/asan.sh; fi
if [[ -z ${SKIP_FUZZ:-} ]]; then stage "fuzz safetensors" bash launch/fuzz.sh "${FUZZ_SECONDS:-60}"; fi

echo "=== summary ($((SECONDS - start)) s in all)"
printf '  %s\n' "${summary[@]}"
exit "$failed"
