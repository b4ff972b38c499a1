// Out-of-line parts of the error hierarchy.
#include "core/errors.hpp"

#include <cerrno>
#include <cstring>

namespace wd {

DataError::DataError(std::string file, std::string item, const std::string& what)
    : Error((file.empty() ? "" : file + ": ") + (item.empty() ? "" : item + ": ") + what),
      file_(std::move(file)),
      item_(std::move(item)) {}

namespace detail {

std::string located(const std::string& what, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return what + " (at " + (base ? base + 1 : file) + ":" + std::to_string(line) + ")";
}

std::string errno_message(const std::string& call) {
  const int err = errno;
  return call + " failed: " + std::strerror(err) + " (errno " + std::to_string(err) + ")";
}

}  // namespace detail
}  // namespace wd
