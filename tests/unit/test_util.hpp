// Helpers shared by the tests: a self-removing temporary directory and a substring check.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace wd::test {

/// A fresh directory under the system temp dir, unique per process and instance, removed
/// (with everything in it) when the object goes away.
class TempDir {
 public:
  explicit TempDir(const std::string& label = "wd") {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            (label + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// The directory, or a file name inside it, as a string.
  std::string str(const std::string& name = "") const {
    return name.empty() ? path_.string() : (path_ / name).string();
  }

 private:
  std::filesystem::path path_;
};

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace wd::test
