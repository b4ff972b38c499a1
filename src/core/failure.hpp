// Failure kinds, the documented exit code of each, and the classification of an exception.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

namespace wd {

/// Why a rank (or the job) stopped. Every kind has one exit code (README "Exit codes").
enum class FailureKind : std::int32_t {
  kNone = 0,
  kError = 1,        ///< any other failure
  kConfig = 2,       ///< bad command line or config value
  kData = 3,         ///< bad input file
  kOutOfMemory = 4,  ///< host or device allocation failed
  kNumerical = 5,    ///< NaN/Inf in the loss or the teacher output
  kPeerLost = 6,     ///< a rank stopped answering (killed, hung): detected by deadline
  kInterrupted = 7,  ///< SIGTERM or SIGINT
};

/// Exit code of a failure kind: 0 for kNone, 1..7 as numbered above.
int exit_code(FailureKind kind);
/// The exit code of a run stopped on purpose after SIGUSR1 with a checkpoint written, so a
/// SLURM script can requeue it (EX_TEMPFAIL).
constexpr int kExitRequeue = 75;

/// The exit codes of the commands besides the failures' (README "Exit codes").
enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,      ///< any other failure
  kExitUsage = 2,      ///< bad command line or config value
  kExitDataError = 3,  ///< bad input file (checkpoint, inputs, config.json)
};

/// The documented exit code of a caught exception.
int exit_code_of(std::exception_ptr failure);

/// Logs a failure of `command` as one clear line (a config error with a pointer to --help)
/// and returns its exit code.
int report_failure(const std::string& command, std::exception_ptr failure);

/// "out of memory", "numerical", ...
const char* failure_kind_name(FailureKind kind);

/// The kind of a caught exception: wd::ConfigError, DataError, OutOfMemory, NumericalError;
/// kOutOfMemory also for std::bad_alloc, LibTorch's allocator failures (CUDA OutOfMemoryError
/// and the CPU allocator's "can't allocate memory"), a CudaError with CUDA's
/// cudaErrorMemoryAllocation code, an NcclError whose text names a failed allocation, and a
/// c10::Error carrying a CUDA library's *_STATUS_ALLOC_FAILED; everything else kError. Exceptions
/// that carry their own kind (a peer's failure, a signal) report it through `KindedError`.
FailureKind classify_failure(std::exception_ptr failure);

/// The message of a caught exception without LibTorch's backtrace.
std::string failure_message(std::exception_ptr failure);

/// Base of exceptions that know their failure kind (raised by the health channel).
class KindedError : public std::runtime_error {
 public:
  KindedError(FailureKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  FailureKind kind() const noexcept { return kind_; }

 private:
  FailureKind kind_;
};

}  // namespace wd
