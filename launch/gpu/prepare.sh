#!/usr/bin/env bash
# Downloads the Debian 12 packages a lent GPU machine lacks (Open MPI, HDF5, Boost.Program_options,
# spdlog/fmt, nlohmann-json, GoogleTest) into gpu-debs/, for launch/gpu/build.sh to unpack there.
# Usage: bash launch/gpu/prepare.sh [DEST]   (on a Debian 12 amd64 machine with apt; DEST: gpu-debs)
#
# The GPU machine has no network and no apt, so the .deb files travel with the working tree (the
# device tool's `carry: ["gpu-debs"]`). Files already in DEST are kept: running it again
# downloads only what is missing. Nothing is installed here.
set -euo pipefail
cd "$(dirname "$0")/../.."

dest=${1:-gpu-debs}

# Unpacked into the prefix as they are: what the build and the runs need.
CORE=(
  # Open MPI 4.1: wrappers and mpirun (openmpi-bin), headers and libmpi.so (libopenmpi-dev),
  # the libraries, and what libopen-pal / PMIx link.
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common
  libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libmunge2
  # What Open MPI's transport plugins (ucx, ofi, openib, psm, psm2) link: without them each
  # plugin fails to load and Open MPI prints a warning per rank (the ranks still run on sm/tcp).
  libucx0 libfabric1 libibverbs1 librdmacm1 libpsm2-2 libnuma1 libpsm-infinipath1
  libnl-3-200 libnl-route-3-200 ibverbs-providers  # the last: libmlx5 / libefa for ucx, libfabric
  # HDF5 1.10 (serial): headers and libhdf5.so under hdf5/serial, the library, szip via libaec.
  # No CMake config ships with Debian's HDF5: FindHDF5 is pointed at the folder (build.sh).
  libhdf5-dev libhdf5-103-1 libsz2 libaec0
  # Boost 1.74 headers (most of the unpacked size) and program_options with its CMake config.
  libboost-program-options-dev libboost-program-options1.74-dev libboost-program-options1.74.0
  libboost1.74-dev
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  nlohmann-json3-dev
  # libgtest-dev holds the headers, libgtest.a and GTestConfig.cmake; googletest (sources) is
  # only its dependency, carried so the unpacked tree matches an apt install.
  libgtest-dev googletest
)

# Unpacked apart (gpu-debs/fallback/); build.sh links in only the libraries the GPU machine's
# own system lacks, so none of these shadow a newer system copy. libhdf5_serial links libcurl
# (its ROS3 driver) and libcrypto; libhwloc links libudev; libpsm_infinipath links libuuid;
# libfabric links libatomic.
FALLBACK=(
  libcurl4 libbrotli1 libcom-err2 libdb5.3 libffi8 libgmp10 libgnutls30 libgssapi-krb5-2
  libhogweed6 libidn2-0 libk5crypto3 libkeyutils1 libkrb5-3 libkrb5support0 libldap-2.5-0
  libnettle8 libnghttp2-14 libp11-kit0 libpsl5 librtmp1 libsasl2-2 libsasl2-modules-db
  libssh2-1 libssl3 libtasn1-6 libunistring2 libzstd1 zlib1g
  libudev1 libuuid1 libatomic1
)

if [[ $(dpkg --print-architecture) != amd64 ]]; then
  echo "prepare.sh: this machine is $(dpkg --print-architecture); the GPU machine needs amd64 packages" >&2
  exit 1
fi

# candidates PKG...: "PKG FILE" for each PKG apt knows, FILE being the name `apt-get download`
# gives its candidate (an epoch's ':' written %3a). One apt-cache call: each takes a second.
candidates() {
  apt-cache show --no-all-versions "$@" 2>/dev/null |
    awk '/^Package:/ { p = $2 } /^Version:/ { v = $2 } /^Architecture:/ { a = $2 }
         /^$/ { if (p) { gsub(":", "%3a", v); print p, p "_" v "_" a ".deb" }; p = "" }
         END { if (p) { gsub(":", "%3a", v); print p, p "_" v "_" a ".deb" } }' || true
}

updated=no
# fetch DIR PKG...: downloads into DIR every PKG whose candidate .deb is not there yet.
fetch() {
  local dir=$1
  shift
  mkdir -p "$dir"
  local -A file=()
  local pkg f
  while read -r pkg f; do file[$pkg]=$f; done < <(candidates "$@")
  if ((${#file[@]} < $#)) && [[ $updated == no ]]; then
    # No package lists (or stale ones): refresh once, then look again.
    echo "prepare.sh: apt knows only ${#file[@]} of $# packages; running apt-get update" >&2
    apt-get update -q >&2
    updated=yes
    while read -r pkg f; do file[$pkg]=$f; done < <(candidates "$@")
  fi
  local missing=() unknown=()
  for pkg in "$@"; do
    if [[ -z ${file[$pkg]:-} ]]; then
      unknown+=("$pkg")
    elif [[ ! -s $dir/${file[$pkg]} ]]; then
      missing+=("$pkg")
    fi
  done
  if ((${#unknown[@]})); then
    echo "prepare.sh: no such package in this machine's apt sources: ${unknown[*]}" >&2
    exit 1
  fi
  if ((${#missing[@]} == 0)); then
    echo "prepare.sh: all $# packages already in $dir" >&2
    return 0
  fi
  echo "prepare.sh: downloading ${missing[*]} into $dir" >&2
  # As root, apt's _apt user cannot write into most folders; apt then downloads unsandboxed and
  # warns about it. That warning is expected here.
  if ! (cd "$dir" && apt-get download -q "${missing[@]}" >&2); then
    [[ $updated == no ]] || exit 1
    echo "prepare.sh: download failed; running apt-get update and trying again" >&2
    apt-get update -q >&2
    updated=yes
    (cd "$dir" && apt-get download -q "${missing[@]}" >&2)
  fi
}

fetch "$dest" "${CORE[@]}"
fetch "$dest/fallback" "${FALLBACK[@]}"

# A manifest (name, version, bytes) the GPU machine can check against, and the total.
manifest=$dest/MANIFEST
{
  for f in "$dest"/*.deb "$dest"/fallback/*.deb; do
    printf '%s %s %s\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)" "$(stat -c %s "$f")"
  done
} >"$manifest"
count=$(wc -l <"$manifest")
total=$(awk '{ s += $3 } END { printf "%.1f", s / 1048576 }' "$manifest")
core_total=$(du -cb "$dest"/*.deb | awk 'END { printf "%.1f", $1 / 1048576 }')
echo "prepare.sh: $count packages in $dest, $total MiB ($core_total MiB core, the rest in $dest/fallback)"
if [[ -e $dest/root ]]; then
  echo "prepare.sh: note: $dest/root (an unpacked prefix) exists; remove it before carrying $dest" \
    "(the device tool carries at most 64 MiB)" >&2
fi
