// Failure kinds: exit codes, names, and classifying exceptions (LibTorch's OOM included).
#include "core/failure.hpp"

#include <torch/torch.h>

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
  } catch (const std::bad_alloc&) {
    return FailureKind::kOutOfMemory;
  } catch (const c10::OutOfMemoryError&) {
    return FailureKind::kOutOfMemory;
  } catch (const c10::Error& e) {
    return is_allocator_failure(e.what_without_backtrace()) ? FailureKind::kOutOfMemory
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

}  // namespace wd
