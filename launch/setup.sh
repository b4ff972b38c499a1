#!/usr/bin/env bash
# Installs what wan-distill needs (missing Debian 12 packages; the pinned PyPI packages in an
# ignored .venv/) and builds it: build/ against Debian's LibTorch 1.13 (CPU), and for `cuda` or
# `all` also build-cuda/ against the CUDA LibTorch 2.11 of the pinned torch wheel. `cpu` leaves
# out .venv/ and the test-only packages (clang, SLURM, python3-venv: the quickstart needs none),
# `venv` installs only those (the tests of either tree need them).
# Usage: bash launch/setup.sh [cpu|cuda|all|venv]   (default cpu; BUILD_DIR, CUDA_BUILD_DIR,
#        BUILD_TYPE, JOBS may be set; BUILD_TARGET builds one target of build/ instead of all
#        (the quickstart: wan-distill); WD_BUILD_BENCH=OFF|ON leaves bench/ out of build/ or
#        puts it back (launch/test.sh: OFF); WD_CCACHE=0 builds without ccache; WD_CUDA_OPT sets the
#        optimisation of build-cuda/, default -O3: launch/test.sh builds it at -O1, see there)
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-cpu}
case $which in cpu | cuda | all | venv) ;; *) echo "setup: unknown build '$which' (cpu, cuda, all or venv)" >&2; exit 2 ;; esac

# What the program needs (every build); `cpu` (the quickstart) installs only these.
PACKAGES=(
  build-essential cmake git ninja-build ccache
  libtorch-dev                   # LibTorch 1.13 (CPU)
  libopenblas0-pthread           # fast BLAS behind libtorch (the reference BLAS is ~10x slower)
  libopenmpi-dev openmpi-bin     # MPI ranks
  libhdf5-dev                    # data sets
  libboost-program-options-dev   # options and config files
  libspdlog-dev nlohmann-json3-dev libgtest-dev
  python3                        # the configure finds it (the source-length checks)
)
# What only the tests and the CUDA tree need: `venv`, `cuda` and `all` (launch/test.sh) add these.
if [[ $which != cpu ]]; then
  PACKAGES+=(
    clang libclang-rt-dev          # libFuzzer and its sanitizers (launch/fuzz.sh, launch/asan.sh)
    slurmctld slurmd slurm-client munge  # SLURM tests (tests/slurm: a private cluster here)
    python3-venv                   # .venv/ for the pinned PyPI packages (launch/requirements.txt)
  )
fi

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

# ccache keeps the object files of earlier builds (both trees); the PCH needs these settings
# for its hits (ccache's manual, "Precompiled headers").
launcher=()
if [[ ${WD_CCACHE:-1} != 0 ]] && command -v ccache >/dev/null; then
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  export CCACHE_BASEDIR=$PWD  # paths relative to the checkout: a fresh clone hits as well
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
jobs=${JOBS:-$(nproc)}

if [[ $which == cpu || $which == all ]]; then
  BUILD_DIR=${BUILD_DIR:-build}
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "${launcher[@]}" \
    ${WD_BUILD_BENCH:+-DWD_BUILD_BENCH="$WD_BUILD_BENCH"}
  cmake --build "$BUILD_DIR" -j"$jobs" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
fi

# The venv serves both trees: build-cuda/ compiles against its torch, and the CTest of either
# runs the training-step reference in it. Reused while launch/requirements.txt is unchanged.
if [[ $which != cpu ]]; then
  stamp=.venv/.requirements
  if ! cmp -s launch/requirements.txt "$stamp" 2>/dev/null; then
    echo "setup: installing launch/requirements.txt into .venv/"
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -r launch/requirements.txt
    cp launch/requirements.txt "$stamp"
  fi
fi

if [[ $which == cuda || $which == all ]]; then
  torch_prefix=$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
  CUDA_BUILD_DIR=${CUDA_BUILD_DIR:-build-cuda}
  # nvcc must match the wheel's CUDA (13.0): /usr/local/cuda is where the toolkit installs.
  if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH=/usr/local/cuda/bin:$PATH; fi
  cmake -S . -B "$CUDA_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
    -DCMAKE_PREFIX_PATH="$torch_prefix" "-DCMAKE_CXX_FLAGS_RELEASE=${WD_CUDA_OPT:--O3} -DNDEBUG" \
    "${launcher[@]}"
  cmake --build "$CUDA_BUILD_DIR" -j"$jobs"
fi
