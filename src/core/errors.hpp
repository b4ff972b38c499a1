// The wan-distill exception hierarchy and the throwing check macros.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace wd {

/// Base of every error the program raises on purpose; main catches it once.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Invalid configuration or command line; the message names every offending value.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// Bad input data: carries the file and the dataset / tensor / field it concerns.
class DataError : public Error {
 public:
  DataError(std::string file, std::string item, const std::string& what);
  const std::string& file() const noexcept { return file_; }
  const std::string& item() const noexcept { return item_; }

 private:
  std::string file_;
  std::string item_;
};

/// Failure of an operating-system call (open, mmap, fsync, rename ...).
class SystemError : public Error {
 public:
  using Error::Error;
};

class MpiError : public Error {
 public:
  using Error::Error;
};

class NcclError : public Error {
 public:
  using Error::Error;
};

/// A failed CUDA runtime call. Keeps CUDA's error code (a cudaError_t, held as an int so that
/// core needs no CUDA headers): a failed allocation (device or pinned host memory) is an out of
/// memory and exits 4, every other code is an error.
class CudaError : public Error {
 public:
  /// cudaErrorMemoryAllocation in CUDA's cudaError enum (comm/cuda_check.hpp asserts it).
  static constexpr int kMemoryAllocation = 2;

  /// `code` 0 (cudaSuccess): the failure did not come with a CUDA code (no device visible).
  explicit CudaError(const std::string& what, int code = 0) : Error(what), code_(code) {}
  /// The cudaError_t of the failed call, as an int.
  int code() const noexcept { return code_; }

 private:
  int code_;
};

/// Out of memory on the host or a device; raised where we can tell it from other failures.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

/// A NaN or Inf where training needs finite numbers (the loss, the teacher's output).
class NumericalError : public Error {
 public:
  using Error::Error;
};

namespace detail {

/// Formats "<what> (at file:line)"; used by the check macros.
std::string located(const std::string& what, const char* file, int line);

/// Formats the current errno as "<call> failed: <strerror> (errno N)".
std::string errno_message(const std::string& call);

/// Stream-style message builder so macros can take `"a" << b << "c"`.
class Msg {
 public:
  template <typename T>
  Msg& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  std::string str() const { return os_.str(); }

 private:
  std::ostringstream os_;
};

}  // namespace detail
}  // namespace wd

/// Throws wd::Error (or the given subclass via WD_CHECK_AS) when `cond` is false.
/// Usage: WD_CHECK(n > 0, "need at least one sample, got " << n);
#define WD_CHECK(cond, msg) WD_CHECK_AS(::wd::Error, cond, msg)

#define WD_CHECK_AS(ErrorType, cond, msg)                                               \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      throw ErrorType(::wd::detail::located((::wd::detail::Msg() << msg).str(), __FILE__, \
                                            __LINE__));                                 \
    }                                                                                   \
  } while (0)

/// Throws wd::DataError naming the file and item when `cond` is false.
#define WD_CHECK_DATA(cond, file, item, msg)                                  \
  do {                                                                        \
    if (!(cond)) {                                                            \
      throw ::wd::DataError((file), (item), (::wd::detail::Msg() << msg).str()); \
    }                                                                         \
  } while (0)

/// Wraps a POSIX call that returns -1 on failure; throws wd::SystemError naming the call.
#define WD_CHECK_SYS(call, context)                                                    \
  do {                                                                                 \
    if ((call) == -1) {                                                                \
      throw ::wd::SystemError(::wd::detail::located(                                   \
          ::wd::detail::errno_message(std::string(#call) + " [" + (context) + "]"),    \
          __FILE__, __LINE__));                                                        \
    }                                                                                  \
  } while (0)
