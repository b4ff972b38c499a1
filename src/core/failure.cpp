// Failure kinds: exit codes, names, and classifying exceptions (LibTorch's OOM included).
#include "core/failure.hpp"

#include <torch/torch.h>

#include <spdlog/spdlog.h>

#include <iostream>
#include <new>

#include "core/errors.hpp"

namespace wd {

namespace {

/// The CPU allocator reports failure as a plain c10::Error; its wording changed over versions.
bool is_allocator_failure(const std::string& text) {
  return text.find("can't allocate memory") != std::string::npos ||
         text.find("not enough memory") != std::string::npos ||
         text.find("out of memory") != std::string::npos;
}

/// cuBLAS, cuDNN, cuSOLVER and cuSPARSE report a failed workspace or handle allocation as
/// <LIB>_STATUS_ALLOC_FAILED; LibTorch's checks put that name into a c10::Error ("CUDA error:
/// CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "cuDNN error:
/// CUDNN_STATUS_ALLOC_FAILED") without the words "out of memory".
bool is_library_alloc_failure(const std::string& text) { return text.find("ALLOC_FAILED") != std::string::npos; }

/// NCCL returns ncclUnhandledCudaError or ncclSystemError for a failed allocation; its last
/// warning, which nccl_error_message appends, says which: "Cuda failure 'out of memory'"
/// (CUDACHECK), "Cuda failure 2 'out of memory'" (CUCHECK on the driver API), or, when its
/// allocation helpers warn after the CUDA call, "Failed to CUDA malloc|calloc|host alloc N bytes"
/// and, for host memory, "Failed to malloc N bytes".
bool is_nccl_alloc_failure(const std::string& text) {
  return text.find("out of memory") != std::string::npos || text.find("Failed to CUDA malloc") != std::string::npos ||
         text.find("Failed to CUDA calloc") != std::string::npos ||
         text.find("Failed to CUDA host alloc") != std::string::npos ||
         text.find("Failed to malloc") != std::string::npos;
}

}  // namespace

int exit_code(FailureKind kind) { return static_cast<int>(kind); }

const char* failure_kind_name(FailureKind kind) {
  switch (kind) {
    case FailureKind::kNone: return "none";
    case FailureKind::kError: return "error";
    case FailureKind::kConfig: return "config error";
    case FailureKind::kData: return "data error";
    case FailureKind::kOutOfMemory: return "out of memory";
    case FailureKind::kNumerical: return "NaN/Inf";
    case FailureKind::kPeerLost: return "stopped answering";
    case FailureKind::kInterrupted: return "interrupted";
  }
  return "unknown";
}

FailureKind classify_failure(std::exception_ptr failure) {
  if (!failure) return FailureKind::kNone;
  try {
    std::rethrow_exception(failure);
  } catch (const KindedError& e) {
    return e.kind();
  } catch (const ConfigError&) {
    return FailureKind::kConfig;
  } catch (const DataError&) {
    return FailureKind::kData;
  } catch (const OutOfMemory&) {
    return FailureKind::kOutOfMemory;
  } catch (const NumericalError&) {
    return FailureKind::kNumerical;
  } catch (const CudaError& e) {
    return e.code() == CudaError::kMemoryAllocation ? FailureKind::kOutOfMemory : FailureKind::kError;
  } catch (const NcclError& e) {
    return is_nccl_alloc_failure(e.what()) ? FailureKind::kOutOfMemory : FailureKind::kError;
  } catch (const std::bad_alloc&) {
    return FailureKind::kOutOfMemory;
  } catch (const c10::OutOfMemoryError&) {
    return FailureKind::kOutOfMemory;
  } catch (const c10::Error& e) {
    const std::string text = e.what_without_backtrace();
    return is_allocator_failure(text) || is_library_alloc_failure(text) ? FailureKind::kOutOfMemory
                                                                        : FailureKind::kError;
  } catch (...) {
    return FailureKind::kError;
  }
}

std::string failure_message(std::exception_ptr failure) {
  if (!failure) return "";
  try {
    std::rethrow_exception(failure);
  } catch (const std::bad_alloc& e) {
    return std::string("host allocation failed (") + e.what() + ")";
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

int exit_code_of(std::exception_ptr failure) { return exit_code(classify_failure(failure)); }

int report_failure(const std::string& command, std::exception_ptr failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const ConfigError& e) {
    spdlog::error("{}: {}", command, e.what());
    std::cerr << "(see: wan-distill " << command << " --help)\n";
  } catch (const DataError& e) {
    spdlog::error("{}: bad input: {}", command, e.what());
  } catch (const std::bad_alloc&) {
    spdlog::error("{}: out of host memory", command);
  } catch (const c10::Error& e) {
    spdlog::error("{}: LibTorch error: {}", command, e.what_without_backtrace());
  } catch (const std::exception& e) {
    spdlog::error("{}: {}", command, e.what());
  } catch (...) {
    spdlog::error("{}: unknown failure", command);
  }
  return exit_code_of(failure);
}

}  // namespace wd
