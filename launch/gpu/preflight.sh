#!/usr/bin/env bash
# Checks a lent GPU machine before the build: glibc, the tools, a g++ that nvcc accepts, Torch,
# the GPU and its compute mode; makes a CUDA toolkit shim when the toolkit lacks the unversioned
# libraries CMake looks for. Writes $BUILD_DIR/preflight.env for build.sh and all.sh.
# Usage: bash launch/gpu/preflight.sh          (exit 0: the build can start; 1: it cannot)
#
# Environment: BUILD_DIR (default build-gpu), PYTHON (default python3), CXX (default g++),
# NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc), CMAKE (default cmake).
# Prints one line per check ("ok", "WARN" or "FAIL") and last a line starting "preflight:" with
# the figures all.sh puts in its summary. A WARN lets the build go on; a FAIL stops it.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

build=$(realpath -m "${BUILD_DIR:-build-gpu}")
python=${PYTHON:-python3}
cxx=${CXX:-g++}
mkdir -p "$build"
env_file=$build/preflight.env
tmp=$(mktemp -d "${TMPDIR:-/tmp}/wd-preflight.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

fails=0
warns=0
ok() { printf '  ok    %-14s %s\n' "$1" "$2"; }
warn() { printf '  WARN  %-14s %s\n' "$1" "$2"; warns=$((warns + 1)); }
fail() { printf '  FAIL  %-14s %s\n' "$1" "$2"; fails=$((fails + 1)); }
# version_ge A B: whether version A >= B.
version_ge() { [[ $(printf '%s\n' "$2" "$1" | sort -V | head -1) == "$2" ]]; }
# first_line CMD...: the first line CMD prints, or nothing (never fails).
first_line() { "$@" 2>&1 | head -1 || true; }

echo "=== launch/gpu/preflight.sh on $(uname -n), $(date -u '+%Y-%m-%d %H:%M:%S UTC')"

# --- The system: glibc (the Debian 12 packages need 2.36), unpacking, disk. ------------------
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
if [[ -z $glibc ]]; then
  fail glibc "getconf GNU_LIBC_VERSION answered nothing"
elif version_ge "$glibc" 2.36; then
  ok glibc "$glibc"
else
  fail glibc "$glibc: the Debian 12 packages in gpu-debs/ need glibc >= 2.36"
fi
if command -v dpkg-deb >/dev/null; then
  ok unpack "dpkg-deb"
elif command -v ar >/dev/null && command -v tar >/dev/null && command -v xz >/dev/null; then
  ok unpack "ar + tar + xz (no dpkg-deb)"
else
  fail unpack "neither dpkg-deb nor ar, tar and xz: build.sh cannot open the .deb files"
fi
free_gib=$(df -Pk "$build" 2>/dev/null | awk 'NR == 2 { printf "%d", $4 / 1048576 }')
if [[ -n $free_gib ]] && ((free_gib < 8)); then
  warn disk "${free_gib} GiB free under $build (the build and the unpacked packages take ~4 GiB)"
else
  ok disk "${free_gib:-?} GiB free under $build"
fi

# --- Build tools. ----------------------------------------------------------------------------
cmake_version=$(first_line "${CMAKE:-cmake}" --version | awk '{ print $3 }')
if [[ -z $cmake_version ]]; then
  fail cmake "not on PATH"
elif version_ge "$cmake_version" 3.22; then
  ok cmake "$cmake_version"
else
  fail cmake "$cmake_version: the project needs CMake >= 3.22"
fi
ninja_version=$(first_line ninja --version)
if [[ -n $ninja_version && $ninja_version =~ ^[0-9] ]]; then
  ok ninja "$ninja_version"
else
  fail ninja "not on PATH (build.sh generates for Ninja)"
fi
cxx_version=$(first_line "$cxx" -dumpfullversion -dumpversion)
if [[ -n $cxx_version && $cxx_version =~ ^[0-9] ]]; then
  ok g++ "$cxx ($cxx_version)"
else
  fail g++ "$cxx not found"
fi

# --- nvcc and the host compiler it accepts. ---------------------------------------------------
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
nvcc_version=
nvcc_flags=
cuda_root=
if [[ ! -x $nvcc ]]; then
  fail nvcc "no nvcc on PATH or in /usr/local/cuda/bin"
else
  nvcc_version=$("$nvcc" --version 2>&1 | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -1)
  cuda_root=$(dirname "$(dirname "$(realpath "$nvcc")")")
  ok nvcc "${nvcc_version:-unknown version} ($nvcc; toolkit $cuda_root)"
  # Torch's CMake files enable the CUDA language: nvcc must accept the host compiler, or the
  # configure step stops. Compiling one file tells; -allow-unsupported-compiler is the way out
  # nvcc itself offers (through NVCC_APPEND_FLAGS, so every nvcc call CMake makes gets it).
  printf '__global__ void k(int* p) { *p = 1; }\nint main() { return 0; }\n' >"$tmp/probe.cu"
  if out=$("$nvcc" -ccbin "$cxx" -c "$tmp/probe.cu" -o "$tmp/probe.o" 2>&1); then
    ok host-compiler "nvcc ${nvcc_version:-?} compiles with $cxx $cxx_version"
  elif "$nvcc" -ccbin "$cxx" -allow-unsupported-compiler -c "$tmp/probe.cu" -o "$tmp/probe.o" >/dev/null 2>&1; then
    nvcc_flags=-allow-unsupported-compiler
    warn host-compiler "nvcc refuses $cxx $cxx_version ($(head -1 <<<"$out")); builds with NVCC_APPEND_FLAGS=$nvcc_flags"
  else
    fail host-compiler "nvcc cannot compile a probe with $cxx: $(head -3 <<<"$out" | tr '\n' ' ')"
  fi
fi

# --- Torch, its CUDA, NCCL, the GPU as Torch sees it. -----------------------------------------
# One Python start (importing torch takes seconds): key=value lines.
probe=$("$python" - 2>&1 <<'EOF'
import importlib.util, os, sys
try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure is the answer
    print("error=" + repr(e).replace("\n", " "))
    sys.exit(0)
print("torch=" + torch.__version__)
print("torch_cuda=" + str(torch.version.cuda))
print("cmake_prefix=" + torch.utils.cmake_prefix_path)
spec = importlib.util.find_spec("nvidia")
libs = []
if spec and spec.submodule_search_locations:
    for base in spec.submodule_search_locations:
        for name in sorted(os.listdir(base)):
            lib = os.path.join(base, name, "lib")
            if os.path.isdir(lib):
                libs.append(lib)
print("wheel_libs=" + ":".join(libs))
nccl = importlib.util.find_spec("nvidia.nccl")
print("nccl=" + (nccl.submodule_search_locations[0] if nccl and nccl.submodule_search_locations else ""))
try:
    print("cuda_available=" + str(torch.cuda.is_available()))
    print("device_count=" + str(torch.cuda.device_count()))
except Exception as e:  # noqa: BLE001
    print("cuda_available=False (" + repr(e).replace("\n", " ") + ")")
EOF
)
pget() { sed -n "s/^$1=//p" <<<"$probe" | head -1; }
torch_version=$(pget torch)
torch_cuda=$(pget torch_cuda)
torch_cmake=$(pget cmake_prefix)
wheel_libs=$(pget wheel_libs)
nccl_dir=$(pget nccl)
cuda_available=$(pget cuda_available)
if [[ -z $torch_version ]]; then
  fail torch "$python cannot import torch: $(pget error)$(grep -v = <<<"$probe" | head -2 | tr '\n' ' ')"
else
  if [[ $torch_version == 2.11.* ]]; then
    ok torch "$torch_version (CUDA $torch_cuda)"
  else
    # 2.13 and later need C++20 headers; this project is C++17 and pins 2.11.
    warn torch "$torch_version (CUDA $torch_cuda): the project is built and checked against 2.11"
  fi
  if [[ $torch_cuda == None || -z $torch_cuda ]]; then
    fail torch-cuda "this torch has no CUDA: the build would be a CPU one"
  elif [[ -n $nvcc_version && ${torch_cuda%%.*} != "${nvcc_version%%.*}" ]]; then
    warn torch-cuda "torch built for CUDA $torch_cuda, nvcc is $nvcc_version (different major versions)"
  fi
  if [[ -n $nccl_dir && -e $nccl_dir/lib/libnccl.so.2 ]]; then
    ok nccl "$nccl_dir"
  else
    warn nccl "no nvidia.nccl wheel with lib/libnccl.so.2: no NCCL, so no nccl_bandwidth or test_nccl_mpi"
  fi
  if [[ $cuda_available == True ]]; then
    ok torch-gpu "torch.cuda.is_available(): True, $(pget device_count) device(s)"
  else
    warn torch-gpu "torch.cuda.is_available(): ${cuda_available:-?} (driver too old for CUDA $torch_cuda, or no GPU): every GPU step will fail"
  fi
fi

# --- The GPU: nvidia-smi, compute mode. -------------------------------------------------------
gpu_name=
compute_mode=unknown
gpu_count=0
if command -v nvidia-smi >/dev/null; then
  query=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader 2>&1)
  if [[ $? -eq 0 && -n $query ]]; then
    gpu_count=$(grep -c . <<<"$query")
    first=$(head -1 <<<"$query")
    gpu_name=$(cut -d, -f1 <<<"$first" | xargs)
    driver=$(cut -d, -f2 <<<"$first" | xargs)
    gpu_memory=$(cut -d, -f3 <<<"$first" | xargs)
    compute_mode=$(cut -d, -f4 <<<"$first" | xargs)
    ok gpu "$gpu_count x $gpu_name, $gpu_memory, driver $driver"
    # Two or three processes share the GPU in train (teacher + student), oom and ctest.
    if [[ $compute_mode == Default ]]; then
      ok compute-mode "$compute_mode (several processes may share the GPU)"
    else
      warn compute-mode "$compute_mode: only one process may hold the GPU; the multi-process steps are skipped"
    fi
  else
    warn gpu "nvidia-smi failed: $(head -1 <<<"$query")"
  fi
else
  warn gpu "no nvidia-smi on PATH"
fi

# --- The CUDA toolkit's unversioned libraries, or a shim of links. ----------------------------
# Torch's CMake files find cudart, cublas, ... by their unversioned names (libcudart.so); pip's
# CUDA wheels ship only the versioned ones (libcudart.so.13). The shim mirrors the toolkit with
# links and adds the missing names; CMake is pointed at it instead of the toolkit.
shim=$build/cuda-shim
cuda_cmake_root=$cuda_root
cuda_cmake_nvcc=$nvcc
shim_state=none
# lib_dirs: the toolkit's library folders; where they hold no libcudart at all (a toolkit
# assembled from wheels), the nvidia wheels' lib/ folders after them (first one wins).
lib_dirs=()
for d in "$cuda_root/lib64" "$cuda_root/lib" "$cuda_root"/targets/*/lib; do
  [[ -d $d ]] && lib_dirs+=("$(realpath "$d")")
done
if ! compgen -G "$cuda_root/lib*/libcudart.so*" >/dev/null && ! compgen -G "$cuda_root/targets/*/lib/libcudart.so*" >/dev/null; then
  IFS=: read -r -a more <<<"$wheel_libs"
  for d in "${more[@]}"; do [[ -n $d && -d $d ]] && lib_dirs+=("$d"); done
fi
# Unique, in order.
mapfile -t lib_dirs < <(printf '%s\n' "${lib_dirs[@]}" | awk 'NF && !seen[$0]++')

if [[ -n $cuda_root ]]; then
  missing=()
  for d in "${lib_dirs[@]}"; do
    for f in "$d"/lib*.so.[0-9]*; do
      [[ -e $f ]] || continue
      base=$(basename "$f")
      plain=${base%%.so.*}.so
      found=no
      for e in "${lib_dirs[@]}"; do [[ -e $e/$plain ]] && found=yes; done
      [[ $found == no ]] && missing+=("$plain")
    done
  done
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | awk 'NF && !seen[$0]++')
  has_cudart=no
  for d in "${lib_dirs[@]}"; do [[ -e $d/libcudart.so ]] && has_cudart=yes; done
  if [[ $has_cudart == yes && ${#missing[@]} -eq 0 ]]; then
    ok libcudart "$cuda_root has libcudart.so and every unversioned name: no shim"
  else
    rm -rf "$shim"
    mkdir -p "$shim/bin" "$shim/lib"
    # bin/ as a real folder of links: nvcc derives the toolkit root from the folder it was
    # called in (its TOP is bin/..), which must then be the shim.
    for f in "$cuda_root"/bin/*; do ln -s "$(realpath "$f")" "$shim/bin/$(basename "$f")"; done
    for f in "$cuda_root"/*; do
      name=$(basename "$f")
      case $name in bin | lib | lib64 | targets) continue ;; esac
      ln -s "$(realpath "$f")" "$shim/$name"
    done
    # lib/: every file and folder of the library folders, then the unversioned links.
    for d in "${lib_dirs[@]}"; do
      for f in "$d"/*; do
        name=$(basename "$f")
        [[ -e $shim/lib/$name || -L $shim/lib/$name ]] || ln -s "$(realpath "$f")" "$shim/lib/$name"
      done
    done
    made=()
    for f in "$shim"/lib/lib*.so.[0-9]*; do
      [[ -e $f ]] || continue
      plain=$(basename "$f")
      plain=${plain%%.so.*}.so
      if [[ ! -e $shim/lib/$plain ]]; then
        # The shortest versioned name (libcudart.so.13 before libcudart.so.13.0.88).
        target=$(printf '%s\n' "$shim/lib/${plain}".[0-9]* | awk '{ print length, $0 }' | sort -n | head -1 | cut -d' ' -f2-)
        ln -s "$(basename "$target")" "$shim/lib/$plain"
        made+=("$plain")
      fi
    done
    ln -s lib "$shim/lib64"
    # targets/<arch>/: the same as the real one, with lib/ and lib64/ the shim's.
    for t in "$cuda_root"/targets/*; do
      [[ -d $t ]] || continue
      arch=$(basename "$t")
      mkdir -p "$shim/targets/$arch"
      for f in "$t"/*; do
        name=$(basename "$f")
        case $name in lib | lib64) ln -s ../../lib "$shim/targets/$arch/$name" ;; *) ln -s "$(realpath "$f")" "$shim/targets/$arch/$name" ;; esac
      done
    done
    if [[ ! -e $shim/lib/libcudart.so ]]; then
      fail libcudart "no libcudart.so.N in $cuda_root or the nvidia wheels (${lib_dirs[*]})"
    else
      ok libcudart "shim $shim: links to $cuda_root, added ${made[*]:-nothing}"
    fi
    cuda_cmake_root=$shim
    cuda_cmake_nvcc=$shim/bin/nvcc
    shim_state="shim (${#made[@]} links added)"
  fi
  # The driver library for linking: the toolkit's stubs, or the system's libcuda.so.1.
  if ! compgen -G "$cuda_cmake_root/lib*/libcuda.so" >/dev/null && ! compgen -G "$cuda_cmake_root/lib*/stubs/libcuda.so" >/dev/null; then
    driver_lib=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / { print $NF; exit }')
    if [[ -n $driver_lib && $cuda_cmake_root == "$shim" ]]; then
      ln -sfn "$driver_lib" "$shim/lib/libcuda.so"
      ok libcuda "the shim's libcuda.so -> $driver_lib"
    elif [[ -n $driver_lib ]]; then
      ok libcuda "$driver_lib (system)"
    else
      warn libcuda "no libcuda.so in the toolkit, its stubs or ldconfig's cache"
    fi
  fi
fi

# --- Open MPI's shared memory. -----------------------------------------------------------------
if [[ -d /dev/shm && -w /dev/shm ]]; then
  ok shm "/dev/shm writable"
else
  warn shm "/dev/shm missing or read-only: Open MPI's shared-memory transport will fail"
fi

cat >"$env_file" <<EOF
# Written by launch/gpu/preflight.sh $(date -u '+%Y-%m-%d %H:%M:%S UTC'); read by build.sh and all.sh.
WD_CUDA_ROOT=$cuda_cmake_root
WD_NVCC=$cuda_cmake_nvcc
WD_NVCC_APPEND_FLAGS=$nvcc_flags
WD_TORCH_VERSION=$torch_version
WD_TORCH_CMAKE=$torch_cmake
WD_NCCL_DIR=$nccl_dir
WD_GPU_NAME="$gpu_name"
WD_GPU_COUNT=$gpu_count
WD_GPU_COMPUTE_MODE=$compute_mode
WD_PREFLIGHT_FAILS=$fails
EOF

echo "preflight: glibc ${glibc:-?}, $cxx ${cxx_version:-?}, nvcc ${nvcc_version:-?}, cmake ${cmake_version:-?}," \
  "torch ${torch_version:-?} (CUDA ${torch_cuda:-?}), GPU ${gpu_name:-?} x$gpu_count, compute mode $compute_mode," \
  "libcudart: $shim_state; $fails failed, $warns warnings"
((fails == 0))
