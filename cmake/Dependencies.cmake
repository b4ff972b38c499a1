# Finds every dependency once. Required: Torch, MPI, HDF5, Boost.Program_options, spdlog,
# nlohmann_json (and GTest for tests). Optional: the CUDA toolkit and NCCL, used only when the
# Torch found was built with CUDA.

find_package(Torch REQUIRED)
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

find_path(WD_NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
find_library(WD_NCCL_LIBRARY nccl
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
if(WD_NCCL_INCLUDE_DIR AND WD_NCCL_LIBRARY)
  set(WD_NCCL_FOUND ON)
  # NCCL ships no CMake config: wrap it once as an imported target.
  add_library(wd::nccl UNKNOWN IMPORTED)
  set_target_properties(wd::nccl PROPERTIES
    IMPORTED_LOCATION "${WD_NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${WD_NCCL_INCLUDE_DIR}")
  if(WD_TORCH_HAS_CUDA)
    set(WD_NCCL_SUMMARY "${WD_NCCL_LIBRARY} (used)")
  else()
    set(WD_NCCL_SUMMARY "${WD_NCCL_LIBRARY} (found; Torch is CPU-only, so GPU transport is off)")
  endif()
else()
  set(WD_NCCL_FOUND OFF)
  set(WD_NCCL_SUMMARY "not found")
endif()
