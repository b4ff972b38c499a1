#!/usr/bin/env bash
# Builds wan-distill with CUDA on a lent GPU machine (no network, no apt): unpacks gpu-debs/ into a
# prefix, points Open MPI, HDF5 and CMake at it, writes build-gpu/gpu-env.sh, configures, builds.
# Usage: bash launch/gpu/build.sh [--env-only | --configure-only] [extra cmake -D args]
#
# Run from anywhere on the GPU machine after launch/gpu/prepare.sh has filled gpu-debs/ on a
# development machine. Environment:
#   GPU_PREFIX   where the packages are unpacked (default gpu-debs/root; unpacked once, again
#                only when the set of .deb files changes)
#   BUILD_DIR    build tree (default build-gpu)      BUILD_TYPE  (default Release)
#   CUDA_ARCHS   CMAKE_CUDA_ARCHITECTURES (default 90: H100/H200); TORCH_CUDA_ARCH_LIST follows
#   JOBS         build jobs (default nproc)          TARGETS     ninja targets (default: all)
#   GPU_OPT      the compiler's optimisation for Release (default -O2: the GPU work is inside
#                LibTorch; -O2 compiles the project's own code faster than -O3)
#   PYTHON       the python holding torch (default python3)
#   LOG_DIR      a second folder for configure.log, written as it grows (all.sh: $OUT, whose
#                build.log is this script's whole output, so a command cut off still returns both)
#   MPI_NO_WRAPPER=1  hand FindMPI the header folder and libmpi.so instead of mpicc's answers
# --env-only stops after unpacking, the environment and the library checks (no CMake);
# --configure-only stops after CMake's configure step.
# The CUDA toolkit (nvcc, its root or the shim of links preflight.sh made) comes from
# $BUILD_DIR/preflight.env; without that file, preflight.sh runs first. CMake's configure step
# is skipped when build.ninja exists and its arguments are unchanged (ninja re-runs CMake when a
# CMakeLists.txt changes). A build cut off by the device's 10-minute limit resumes where it
# stopped when run again.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

mode=all
case "${1:-}" in
  --env-only | --configure-only) mode=${1#--}; shift ;;
  -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
esac
for a in "$@"; do
  [[ $a == --* ]] && { echo "build.sh: unknown option $a (see --help)" >&2; exit 2; }
done

debs=$repo/gpu-debs
prefix=$(realpath -m "${GPU_PREFIX:-$debs/root}")
build=$(realpath -m "${BUILD_DIR:-build-gpu}")
arch_dir=usr/lib/x86_64-linux-gnu

say() { echo "build.sh: $*" >&2; }
die() { say "error: $*"; exit 1; }

shopt -s nullglob
core_debs=("$debs"/*.deb)
fallback_debs=("$debs"/fallback/*.deb)
shopt -u nullglob
((${#core_debs[@]})) || die "no .deb files in $debs: run bash launch/gpu/prepare.sh on a Debian 12 machine first"

# The packages are Debian 12's: libevent needs glibc 2.36, spdlog libstdc++ from GCC 12.
glibc=$(getconf GNU_LIBC_VERSION | awk '{ print $2 }')
if [[ $(printf '%s\n' 2.36 "$glibc" | sort -V | head -1) != 2.36 ]]; then
  die "glibc $glibc here; the Debian 12 packages in $debs need glibc >= 2.36"
fi

# deb_extract DEB DIR: dpkg-deb where the image has it, else ar + tar (binutils comes with gcc).
deb_extract() {
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$1" "$2"
    return
  fi
  local member
  member=$(ar t "$1" | grep '^data\.tar')
  case $member in
    *.xz) ar p "$1" "$member" | tar -xJ -C "$2" ;;
    *.zst) ar p "$1" "$member" | tar --zstd -x -C "$2" ;;
    *.gz) ar p "$1" "$member" | tar -xz -C "$2" ;;
    *) ar p "$1" "$member" | tar -x -C "$2" ;;
  esac
}

# --- 1. Unpack: core packages into the prefix, the fallback ones beside them. ---------------
stamp=$prefix/.unpacked
wanted=$(cd "$debs" && find . -maxdepth 2 -name "*.deb" | sort)
if [[ -f $stamp && $(cat "$stamp") == "$wanted" ]]; then
  say "packages already unpacked in $prefix"
else
  # The prefix is replaced whole; never a folder this script did not make.
  if [[ -e $prefix && ! -f $stamp && -n $(ls -A "$prefix" 2>/dev/null) ]]; then
    die "GPU_PREFIX $prefix exists and was not made by build.sh; name an empty or new folder"
  fi
  say "unpacking ${#core_debs[@]} packages into $prefix (${#fallback_debs[@]} fallback ones into $prefix/fallback-root)"
  rm -rf "$prefix"
  mkdir -p "$prefix/fallback-root"
  for f in "${core_debs[@]}"; do deb_extract "$f" "$prefix"; done
  for f in "${fallback_debs[@]}"; do deb_extract "$f" "$prefix/fallback-root"; done

  # What Debian's maintainer scripts (update-alternatives) would have linked, and dpkg -x does
  # not: the unsuffixed MPI commands (launch/mpirun.sh calls `mpirun`), mpi.h / libmpi.so in
  # the usual places, and the soname libfabric and the psm plugin load.
  mkdir -p "$prefix/bin"
  for cmd in mpirun mpiexec mpicc mpicxx mpic++ mpiCC; do
    ln -sfn "../usr/bin/$cmd.openmpi" "$prefix/bin/$cmd"
  done
  mkdir -p "$prefix/usr/include/x86_64-linux-gnu"
  ln -sfn ../../lib/x86_64-linux-gnu/openmpi/include "$prefix/usr/include/x86_64-linux-gnu/mpi"
  ln -sfn openmpi/lib/libmpi.so "$prefix/$arch_dir/libmpi.so"
  ln -sfn ../libpsm1/libpsm_infinipath.so.1.16 "$prefix/$arch_dir/libpsm_infinipath.so.1"
  echo "$wanted" >"$stamp"
fi

# --- 2. The environment for the relocated prefix, in a file later commands source. ----------
lib_dirs=(
  "$prefix/$arch_dir/openmpi/lib"
  "$prefix/$arch_dir/pmix2/lib"
  "$prefix/$arch_dir/hdf5/serial"
  "$prefix/$arch_dir"
  "$prefix/fallback-lib"
)
env_file=$build/gpu-env.sh
pmix=$prefix/$arch_dir/pmix2
mkdir -p "$build" "$prefix/fallback-lib"
cat >"$env_file" <<EOF
# Environment for wan-distill built by launch/gpu/build.sh against the packages in
# $prefix. Source it: . $env_file
export WD_GPU_PREFIX=$prefix
# Open MPI and PMIx were built for /usr. OPAL_PREFIX relocates what Open MPI derives from its
# prefix (plugins, help files, wrapper data); its settings file (Debian's: no ucx, openib, ofi)
# sits in an absolute /etc/openmpi. Debian's PMIx has absolute lib/ and share/ folders, each
# relocated by name.
export OPAL_PREFIX=$prefix/usr OPAL_SYSCONFDIR=$prefix/etc/openmpi
export PMIX_INSTALL_PREFIX=$pmix PMIX_LIBDIR=$pmix/lib PMIX_INCLUDEDIR=$pmix/include
export PMIX_DATAROOTDIR=$pmix/share PMIX_DATADIR=$pmix/share
export PATH=$prefix/bin:$prefix/usr/bin:\${PATH:-/usr/bin:/bin}
export LD_LIBRARY_PATH=$(IFS=:; echo "${lib_dirs[*]}")\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
# No ssh on the machine: mpirun's rsh launcher refuses to start without an agent, although one
# node never uses it. Commands run as root, which Open MPI refuses unless told.
export OMPI_MCA_plm_rsh_agent=\${OMPI_MCA_plm_rsh_agent:-sh}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Shared-memory messages without single-copy (CMA) reads: those need ptrace rights between the
# ranks, which a sandboxed machine may deny (the run then aborts at the first large message).
export OMPI_MCA_btl_vader_single_copy_mechanism=\${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
# PMIx's in-memory key store: its shared-memory stores have hung in sandboxes.
export PMIX_MCA_gds=\${PMIX_MCA_gds:-hash}
EOF
# shellcheck source=/dev/null
. "$env_file"

# --- 3. Libraries the system lacks: link them from the fallback packages, then check. --------
# ldd_report: ldd of every unpacked library and program, each line prefixed with the file.
ldd_report() {
  # UCX's modules (ucx/) find each other through UCX's own loader, not ldd's paths.
  find "$prefix/usr" -type f \( -name '*.so' -o -name '*.so.*' -o -path "$prefix/usr/bin/*" \) \
    -not -path "*/$arch_dir/ucx/*" |
    while read -r f; do ldd "$f" 2>&1 | sed "s|^|$f: |"; done
}
# Each round links what is missing; the next finds what those links need in turn.
for _ in 1 2 3 4 5 6; do
  report=$(ldd_report)
  linked=0
  while read -r name; do
    [[ -z $name || -e $prefix/fallback-lib/$name ]] && continue
    src=$(find "$prefix/fallback-root" -name "$name" \( -type f -o -type l \) -print -quit)
    [[ -n $src ]] || continue
    ln -sfn "$(realpath --relative-to="$prefix/fallback-lib" "$src")" "$prefix/fallback-lib/$name"
    say "the system lacks $name: using $(realpath --relative-to="$prefix" "$src")"
    linked=1
  done < <(awk '/=> not found/ { print $2 }' <<<"$report" | sort -u)
  ((linked)) || break
done
problems=$(grep -E '=> not found|version `' <<<"$report" | sort -u || true)
if [[ -n $problems ]]; then
  # A transport plugin that cannot load only warns; the build and the tests need these.
  essential='libmpi\.so|libopen-pal|libopen-rte|libpmix\.so|libhdf5_serial\.so|libboost_program_options|libspdlog|/orted|/orterun|opal_wrapper|mca_(pml_ob1|btl_(self|vader|tcp)|ess_|plm_|odls_|pmix_ext3x|oob_tcp)'
  say "libraries still unresolved:"
  echo "  ${problems//$'\n'/$'\n'  }" >&2
  if grep -Eq "^[^:]*($essential)" <<<"$problems"; then
    die "an essential library above cannot load"
  fi
fi

# Open MPI answers from the prefix, and one node runs two ranks.
ompi_version=$(mpirun --version 2>&1 | head -1)
mpi_smoke="ok"
if ! out=$(timeout 60 mpirun -np 2 --oversubscribe true 2>&1); then
  mpi_smoke="FAILED: $out"
fi

hdf5_version=$(sed -n 's/^#define H5_VERSION "\(.*\)"/\1/p' "$prefix/usr/include/hdf5/serial/H5pubconf.h")
boost_version=$(sed -n 's/^#define BOOST_LIB_VERSION "\(.*\)"/\1/p' "$prefix/usr/include/boost/version.hpp")

if [[ $mode == env-only ]]; then
  say "environment in $env_file"
  echo "  prefix     : $prefix"
  echo "  glibc      : $glibc"
  echo "  Open MPI   : $ompi_version ($(command -v mpirun)); mpirun -np 2: $mpi_smoke"
  echo "  HDF5       : $hdf5_version   Boost: $boost_version"
  exit 0
fi

# --- 4. Torch, CUDA and NCCL from the machine's own Python and toolkit. ---------------------
if [[ ! -f $build/preflight.env ]]; then
  say "no $build/preflight.env: running launch/gpu/preflight.sh first"
  BUILD_DIR=$build bash "$repo/launch/gpu/preflight.sh" || die "preflight.sh found a problem the build cannot pass (above)"
fi
# shellcheck source=/dev/null
. "$build/preflight.env"
python=${PYTHON:-python3}
# Torch's CMake folder and NCCL's wheel: preflight.sh asked Python already (importing torch
# takes seconds); asked again only where its file lacks them.
torch_cmake=${WD_TORCH_CMAKE:-}
torch_version=${WD_TORCH_VERSION:-}
nccl_dir=${WD_NCCL_DIR:-}
if [[ -z $torch_cmake ]]; then
  torch_info=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path); print(torch.__version__)') ||
    die "$python cannot import torch"
  torch_cmake=$(sed -n 1p <<<"$torch_info")
  torch_version=$(sed -n 2p <<<"$torch_info")
  # The wheel nvidia-nccl-cu13 ships nccl.h and libnccl.so.2 (no unversioned libnccl.so, which
  # find_library looks for): name both for the project's NCCL lookup.
  nccl_dir=$("$python" -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(s.submodule_search_locations[0] if s else "")' 2>/dev/null || true)
fi
# nvcc and the toolkit root CMake is given: the toolkit's own, or the shim preflight.sh made
# where the toolkit lacks unversioned libraries (libcudart.so).
nvcc=${WD_NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[[ -x $nvcc ]] || die "no nvcc at $nvcc (preflight.env), on PATH or in /usr/local/cuda/bin"
cuda_root=${WD_CUDA_ROOT:-$(dirname "$(dirname "$(realpath "$nvcc")")")}
if [[ -n ${WD_NVCC_APPEND_FLAGS:-} ]]; then
  export NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:+$NVCC_APPEND_FLAGS }$WD_NVCC_APPEND_FLAGS"
fi
nvcc_version=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
cuda_archs=${CUDA_ARCHS:-90}
# 90 -> 9.0, 90a -> 9.0a, 100 -> 10.0: the same architectures in Torch's notation.
torch_archs=$(tr ';,' '  ' <<<"$cuda_archs" | xargs -n1 | sed -E 's/^([0-9]+)([0-9])([a-z]?)(-real|-virtual)?$/\1.\2\3/' | paste -sd';')

cmake_args=(
  -G Ninja -S "$repo" -B "$build"
  -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}"
  -DCMAKE_CXX_FLAGS_RELEASE="${GPU_OPT:--O2} -DNDEBUG"
  -DCMAKE_PREFIX_PATH="$torch_cmake;$prefix/usr;$prefix/$arch_dir/cmake;$prefix/usr/share/cmake"
  -DCMAKE_CUDA_COMPILER="$nvcc"
  # CMake's FindCUDAToolkit reads the first, Torch's own FindCUDA the second.
  -DCUDAToolkit_ROOT="$cuda_root"
  -DCUDA_TOOLKIT_ROOT_DIR="$cuda_root"
  -DCMAKE_CUDA_ARCHITECTURES="$cuda_archs"
  -DTORCH_CUDA_ARCH_LIST="$torch_archs"
  # mpiexec from the prefix, never a system one: it is what the multi-rank tests run.
  -DMPIEXEC_EXECUTABLE="$prefix/usr/bin/mpiexec.openmpi"
  # HDF5: Debian ships no CMake config and its h5cc hard-codes /usr; HDF5_ROOT makes FindHDF5
  # search only this folder (include/ and lib/ in it are links to the serial build).
  -DHDF5_ROOT="$prefix/$arch_dir/hdf5/serial"
  -DHDF5_PREFER_PARALLEL=OFF
  -DBoost_NO_SYSTEM_PATHS=ON
)
if [[ -n ${MPI_NO_WRAPPER:-} ]]; then
  # Without asking the compiler wrapper: the header folder and library named directly.
  cmake_args+=(-DMPI_SKIP_COMPILER_WRAPPER=ON -DMPI_C_LIB_NAMES=mpi
    -DMPI_C_HEADER_DIR="$prefix/$arch_dir/openmpi/include"
    -DMPI_mpi_LIBRARY="$prefix/$arch_dir/openmpi/lib/libmpi.so")
else
  # The wrapper reports the prefix's flags once OPAL_PREFIX is set (gpu-env.sh).
  cmake_args+=(-DMPI_EXECUTABLE_SUFFIX=.openmpi -DMPI_C_COMPILER="$prefix/usr/bin/mpicc.openmpi")
fi
if [[ -n $nccl_dir && -f $nccl_dir/lib/libnccl.so.2 ]]; then
  cmake_args+=(-DNCCL_ROOT="$nccl_dir" -DWD_NCCL_INCLUDE_DIR="$nccl_dir/include"
    -DWD_NCCL_LIBRARY="$nccl_dir/lib/libnccl.so.2")
fi
cmake_args+=("$@")

echo "=== launch/gpu/build.sh found"
echo "  prefix       : $prefix (glibc $glibc)"
echo "  Open MPI     : $ompi_version; mpirun -np 2: $mpi_smoke"
echo "  HDF5         : $hdf5_version ($prefix/$arch_dir/hdf5/serial)"
echo "  Boost        : $boost_version"
echo "  Torch        : $torch_version ($torch_cmake)"
echo "  nvcc         : $nvcc_version ($nvcc; toolkit root for CMake: $cuda_root${WD_NVCC_APPEND_FLAGS:+; NVCC_APPEND_FLAGS=$WD_NVCC_APPEND_FLAGS})"
echo "  NCCL         : ${nccl_dir:-not found (no nvidia.nccl in $python)}"
echo "  CUDA archs   : $cuda_archs (Torch: $torch_archs)"
echo "  CMake        : $(cmake --version | head -1), $(command -v ninja || echo 'no ninja')"
echo "  GPU          : $(nvidia-smi -L 2>/dev/null | head -1 || echo 'nvidia-smi failed')"
echo "  build dir    : $build (environment: $env_file)"

# tee_logs NAME [--copy]: the output into $build/NAME and, with --copy and LOG_DIR set, also
# LOG_DIR/NAME, as it comes.
tee_logs() {
  local files=("$build/$1")
  [[ ${2:-} == --copy && -n ${LOG_DIR:-} ]] && mkdir -p "$LOG_DIR" && files+=("$LOG_DIR/$1")
  tee "${files[@]}"
}

# The configure step costs tens of seconds (Torch's CMake files probe CUDA): skipped when the
# tree was configured with these arguments and generated build.ninja.
args_stamp=$build/.configure-args
args_now=$(printf '%s\n' "${cmake_args[@]}" "NVCC_APPEND_FLAGS=${NVCC_APPEND_FLAGS:-}")
if [[ -f $build/build.ninja && -f $args_stamp && $(cat "$args_stamp") == "$args_now" ]]; then
  say "configured already with these arguments: skipping CMake's configure step"
  echo "(configure skipped: $build/build.ninja is current for these arguments)" | tee_logs configure.log --copy
else
  rm -f "$args_stamp"
  say "cmake ${cmake_args[*]}"
  set +e
  cmake "${cmake_args[@]}" 2>&1 | tee_logs configure.log --copy
  rc=${PIPESTATUS[0]}
  set -e
  ((rc == 0)) || die "CMake's configure step failed (exit $rc): $build/configure.log"
  echo "$args_now" >"$args_stamp"
fi
[[ $mode == configure-only ]] && exit 0

jobs=${JOBS:-$(nproc)}
set +e
# shellcheck disable=SC2086  # TARGETS is a list of names
cmake --build "$build" -j"$jobs" ${TARGETS:+--target $TARGETS} 2>&1 | tee_logs build.log
rc=${PIPESTATUS[0]}
set -e
((rc == 0)) || die "the build failed (exit $rc): $build/build.log"
say "built $build${TARGETS:+ (targets: $TARGETS)}; next: bash launch/gpu/all.sh"
