// The WD_CHECK_CUDA macro. Torch-free and NCCL-free: for every file that calls the CUDA runtime
// itself (the NCCL layer, the block streamer's copy engine); they link the CUDA runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "comm/wait.hpp"
#include "core/errors.hpp"

namespace wd::comm {

/// Formats a failed CUDA runtime call: "<call> failed: <cudaGetErrorString> (<name>) (rank R,
/// at file:line)".
inline std::string cuda_error_message(cudaError_t rc, const char* call, const char* file, int line) {
  return std::string(call) + " failed: " + cudaGetErrorString(rc) + " (" + cudaGetErrorName(rc) + ") " +
         call_site(file, line);
}

static_assert(static_cast<int>(cudaErrorMemoryAllocation) == ::wd::CudaError::kMemoryAllocation,
              "wd::CudaError::kMemoryAllocation is CUDA's cudaErrorMemoryAllocation");

}  // namespace wd::comm

/// Throws wd::CudaError naming the call, CUDA's error string, the rank and file:line, and
/// carrying CUDA's error code (a failed allocation classifies as out of memory).
#define WD_CHECK_CUDA(call)                                                                     \
  do {                                                                                          \
    const cudaError_t wd_cuda_rc_ = (call);                                                     \
    if (wd_cuda_rc_ != cudaSuccess) {                                                           \
      throw ::wd::CudaError(                                                                    \
          ::wd::comm::cuda_error_message(wd_cuda_rc_, #call, __FILE__, __LINE__),               \
          static_cast<int>(wd_cuda_rc_));                                                       \
    }                                                                                           \
  } while (0)
