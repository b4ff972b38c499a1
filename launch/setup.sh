#!/usr/bin/env bash
# Installs the Debian 12 packages wan-distill needs (only those missing) and builds it in build/.
# Usage: bash launch/setup.sh            (BUILD_DIR, BUILD_TYPE and JOBS may be set)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake git
  libtorch-dev                   # LibTorch 1.13 (CPU)
  libopenblas0-pthread           # fast BLAS behind libtorch (the reference BLAS is ~10x slower)
  libopenmpi-dev openmpi-bin     # MPI ranks
  libhdf5-dev                    # data sets
  libboost-program-options-dev   # options and config files
  libspdlog-dev nlohmann-json3-dev libgtest-dev
  clang libclang-rt-dev          # libFuzzer and its sanitizers (launch/fuzz.sh)
  slurmctld slurmd slurm-client munge  # SLURM tests (tests/slurm: a private cluster here)
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}"
cmake --build "$BUILD_DIR" -j"${JOBS:-$(nproc)}"
