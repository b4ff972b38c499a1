# Finds every dependency once. Required: Torch, MPI, HDF5, Boost.Program_options, spdlog,
# nlohmann_json (and GTest for tests). Optional: the CUDA toolkit and NCCL, used only when the
# Torch found was built with CUDA.

# TorchConfig finds its libraries with find_library(... PATHS <torch>/lib), and PATHS come after
# the system folders: with Debian's libtorch installed as well, a pip wheel's config would pick
# /usr/lib's libtorch.so. Putting the wheel's lib/ on CMAKE_LIBRARY_PATH puts it first.
foreach(_wd_config_dir ${CMAKE_PREFIX_PATH} ${Torch_DIR}/..)
  if(EXISTS "${_wd_config_dir}/Torch/TorchConfig.cmake")
    get_filename_component(_wd_torch_lib "${_wd_config_dir}/../../lib" ABSOLUTE)
    list(PREPEND CMAKE_LIBRARY_PATH "${_wd_torch_lib}")
  endif()
endforeach()
find_package(Torch REQUIRED)
# The pip wheels' libtorch.so exports std::filesystem functions of its own (64 symbols, built
# with an older libstdc++), and a program that lists libtorch before libstdc++ among its needed
# libraries binds std::filesystem::remove_all & co. to them: they crash. Naming libstdc++ first
# on every link line puts it first in that list, so ours win.
if(Torch_VERSION VERSION_GREATER_EQUAL 2 AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  add_link_options(-Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state)
endif()
get_filename_component(_wd_torch_prefix "${Torch_DIR}/../../.." ABSOLUTE)
if(NOT TORCH_LIBRARY MATCHES "^${_wd_torch_prefix}/")
  message(FATAL_ERROR "Torch's config in ${Torch_DIR} found the library ${TORCH_LIBRARY}, which "
    "belongs to another LibTorch; expected one under ${_wd_torch_prefix}/lib. Clear the build "
    "folder's CMakeCache.txt, or set TORCH_LIBRARY.")
endif()
# TorchConfig appends its flags to CMAKE_CXX_FLAGS globally; we link the imported `torch`
# target instead, which carries the same flags as usage requirements.
string(REPLACE "${TORCH_CXX_FLAGS}" "" CMAKE_CXX_FLAGS "${CMAKE_CXX_FLAGS}")
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(WD_TORCH_HAS_CUDA ON)
else()
  set(WD_TORCH_HAS_CUDA OFF)
endif()

find_package(MPI REQUIRED COMPONENTS C)
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(Boost 1.74 REQUIRED COMPONENTS program_options)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)

# A pip LibTorch 2.x ships its own fmt (12.x) in <torch>/include/fmt, which comes before
# /usr/include on every compile line; Debian's spdlog 1.10 is built against Debian's fmt 9 and
# does not compile with fmt 10 or later. A folder holding only a link to spdlog's own fmt
# headers, put first on every include path (directory-level, so ahead of the imported torch
# target's), keeps spdlog and our code on that fmt; the LibTorch headers we include do not
# use fmt, and LibTorch's compiled fmt stays inside its libraries.
if(EXISTS "${TORCH_INSTALL_PREFIX}/include/fmt" AND TARGET fmt::fmt)
  get_target_property(_wd_fmt_include fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  list(GET _wd_fmt_include 0 _wd_fmt_include)
  set(WD_FMT_SHIM "${CMAKE_BINARY_DIR}/fmt-shim")
  file(MAKE_DIRECTORY "${WD_FMT_SHIM}")
  file(CREATE_LINK "${_wd_fmt_include}/fmt" "${WD_FMT_SHIM}/fmt" SYMBOLIC)
  include_directories(BEFORE SYSTEM "${WD_FMT_SHIM}")
  message(STATUS "fmt: ${_wd_fmt_include}/fmt ahead of LibTorch's bundled fmt (via ${WD_FMT_SHIM})")
endif()
if(WD_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()

# HDF5's imported target name differs between CMake versions.
if(TARGET HDF5::HDF5)
  set(WD_HDF5_TARGET HDF5::HDF5)
elseif(TARGET hdf5::hdf5)
  set(WD_HDF5_TARGET hdf5::hdf5)
else()
  add_library(wd_hdf5 INTERFACE IMPORTED)
  target_include_directories(wd_hdf5 INTERFACE ${HDF5_INCLUDE_DIRS})
  target_link_libraries(wd_hdf5 INTERFACE ${HDF5_LIBRARIES})
  set(WD_HDF5_TARGET wd_hdf5)
endif()

# CUDA toolkit and NCCL: detected and reported; wired in only for a CUDA Torch.
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  set(WD_CUDA_SUMMARY "${CUDAToolkit_VERSION} (${CUDAToolkit_BIN_DIR})")
  # The CUDA runtime our own CUDA code links. A CUDA LibTorch loads the shared cudart: one
  # runtime per process, so use the same one. Without it, the static runtime keeps the CPU
  # build free of a libcudart.so dependency.
  if(WD_TORCH_HAS_CUDA)
    set(WD_CUDART CUDA::cudart)
  else()
    set(WD_CUDART CUDA::cudart_static)
  endif()
else()
  set(WD_CUDA_SUMMARY "not found")
endif()

# NCCL: a CUDA LibTorch from a pip wheel loads the wheel's libnccl.so.2 (nvidia/nccl/lib beside
# torch/), so that copy comes first: one NCCL per process. The wheels ship only the versioned
# name, hence `libnccl.so.2` among the names. Then NCCL_ROOT and the CUDA toolkit.
option(WD_NCCL "Build the NCCL transport and gradient reducer (required with a CUDA LibTorch)" ON)
set(WD_NCCL_FOUND OFF)
set(WD_NCCL_SUMMARY "off (-DWD_NCCL=OFF)")
if(WD_NCCL)
  # Torch_DIR is <site-packages>/torch/share/cmake/Torch for a wheel.
  get_filename_component(_wd_site_packages "${Torch_DIR}/../../../.." ABSOLUTE)
  set(_wd_wheel_nccl "${_wd_site_packages}/nvidia/nccl")
  find_path(WD_NCCL_INCLUDE_DIR nccl.h
    HINTS ${_wd_wheel_nccl}/include ${NCCL_ROOT}/include $ENV{NCCL_ROOT}/include
          ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(WD_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
    HINTS ${_wd_wheel_nccl}/lib ${NCCL_ROOT}/lib $ENV{NCCL_ROOT}/lib
          ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(WD_NCCL_INCLUDE_DIR AND WD_NCCL_LIBRARY)
    set(WD_NCCL_FOUND ON)
    # NCCL ships no CMake config: wrap it once as an imported target.
    add_library(wd::nccl UNKNOWN IMPORTED)
    set_target_properties(wd::nccl PROPERTIES
      IMPORTED_LOCATION "${WD_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${WD_NCCL_INCLUDE_DIR}")
    if(WD_NCCL_LIBRARY MATCHES "^${_wd_wheel_nccl}/")
      set(_wd_nccl_origin "from the torch wheel")
    else()
      set(_wd_nccl_origin "from the CUDA toolkit or NCCL_ROOT")
    endif()
    if(WD_TORCH_HAS_CUDA)
      set(WD_NCCL_SUMMARY "${WD_NCCL_LIBRARY} (${_wd_nccl_origin}; NCCL transport and reducer built)")
    else()
      set(WD_NCCL_SUMMARY "${WD_NCCL_LIBRARY} (${_wd_nccl_origin}; Torch is CPU-only, so only NcclComm and its tests)")
    endif()
  elseif(WD_TORCH_HAS_CUDA)
    message(FATAL_ERROR
      "Torch ${Torch_VERSION} has CUDA, but NCCL was not found (nccl.h: ${WD_NCCL_INCLUDE_DIR}, "
      "library: ${WD_NCCL_LIBRARY}). Looked in ${_wd_wheel_nccl} (the nvidia-nccl wheel), "
      "NCCL_ROOT and the CUDA toolkit. Install the wheel (pip install -r launch/requirements.txt), "
      "set NCCL_ROOT, or configure with -DWD_NCCL=OFF to build without the GPU transport.")
  else()
    set(WD_NCCL_SUMMARY "not found")
  endif()
endif()
