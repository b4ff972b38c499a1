// The subcommands of the wan-distill executable and the exit codes they share.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace wd::app {

/// Exit codes (documented in README.md); the failures' codes come from core/failure.hpp
/// (4 out of memory, 5 NaN/Inf, 6 a rank stopped answering, 7 interrupted, 75 requeue).
enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,      ///< any other failure
  kExitUsage = 2,      ///< bad command line or config value
  kExitDataError = 3,  ///< bad input file (checkpoint, inputs, config.json)
};

/// Each takes the words after the subcommand name and returns an exit code; errors propagate
/// as wd::Error subclasses to main, which maps them to exit codes.
int run_convert(const std::vector<std::string>& args);
int run_forward(const std::vector<std::string>& args);
int run_init_teacher(const std::vector<std::string>& args);
int run_inspect(const std::vector<std::string>& args);
int run_train(const std::vector<std::string>& args);
int run_plan(const std::vector<std::string>& args);
int run_make_dataset(const std::vector<std::string>& args);
int run_layout(const std::vector<std::string>& args);
int run_sample(const std::vector<std::string>& args);

/// Prints "usage: ...", a short description and the options table (with real defaults).
void print_help(const std::string& usage, const std::string& about, const OptionTable& table);

/// Parses "2GB", "512MB", "1GiB", "1000000" into bytes (decimal TB/GB/MB/KB, binary TiB/GiB/MiB/KiB);
/// throws wd::ConfigError naming `option` otherwise.
std::uint64_t parse_size(const std::string& text, const std::string& option);

/// Parses "a,b,c" into exactly `count` positive integers; throws wd::ConfigError naming `option`.
std::vector<std::int64_t> parse_dims(const std::string& text, std::size_t count,
                                     const std::string& option);

/// The documented exit code of a failure.
int exit_code_of(std::exception_ptr failure);
/// Logs a failure as one clear line and returns its exit code.
int report_failure(const std::string& command, std::exception_ptr failure);

}  // namespace wd::app
