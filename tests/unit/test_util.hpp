// Helpers shared by the tests: a self-removing temporary directory, a substring check, and
// running a command line with its output captured.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
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

/// What a command printed (stdout and stderr together) and its exit status.
struct CommandResult {
  int code;
  std::string output;
};

/// Runs a shell command line and captures its output and exit status (-1: killed by a signal).
inline CommandResult run_command(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  EXPECT_NE(pipe, nullptr) << command;
  std::string out;
  std::array<char, 4096> buf{};
  while (pipe && std::fgets(buf.data(), buf.size(), pipe)) out += buf.data();
  const int status = pipe ? ::pclose(pipe) : -1;
  return {pipe && WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace wd::test
