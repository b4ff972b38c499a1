#!/usr/bin/env bash
# Runs the test suite (what CI runs): set up and build both trees if needed, every CTest test of
# the Debian LibTorch 1.13 build (build/), the unit and MPI tests of the CUDA LibTorch 2.11 build
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

# Two tests at a time (CTEST_PARALLEL): most multi-rank tests spend their time waiting (deadlines,
# mpirun's stop sequence), and every one has its own timeout.
stage "ctest (LibTorch 1.13 CPU build)" ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure \
  --timeout 600 --parallel "${CTEST_PARALLEL:-2}" "$@"
# The SLURM tests check the sbatch templates and the job's launch, not LibTorch, and the toy bench
# checks an objective, not the build: once is enough.
if [[ -z ${SKIP_CUDA:-} ]]; then
  stage "ctest (LibTorch 2.11 CUDA build, on the CPU)" ctest --test-dir "${CUDA_BUILD_DIR:-build-cuda}" \
    --output-on-failure --timeout 600 --parallel "${CTEST_PARALLEL:-2}" -LE 'slurm|bench' "$@"
fi
if [[ -z ${SKIP_ASAN:-} ]]; then stage "asan data tests" bash launch/asan.sh; fi
if [[ -z ${SKIP_FUZZ:-} ]]; then stage "fuzz safetensors" bash launch/fuzz.sh "${FUZZ_SECONDS:-60}"; fi

echo "=== summary ($((SECONDS - start)) s in all)"
printf '  %s\n' "${summary[@]}"
exit "$failed"
