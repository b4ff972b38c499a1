// The subcommands of the wan-distill executable and the exit codes they share.
#pragma once

#include <string>
#include <vector>

#include "core/config.hpp"

namespace wd::app {

/// Exit codes (documented in README.md).
enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,      ///< any other failure
  kExitUsage = 2,      ///< bad command line or config value
  kExitDataError = 3,  ///< bad input file (checkpoint, inputs, config.json)
};

/// Each takes the words after the subcommand name and returns an exit code; errors propagate
/// as wd::Error subclasses to main, which maps them to exit codes.
int run_forward(const std::vector<std::string>& args);
int run_init_teacher(const std::vector<std::string>& args);
int run_inspect(const std::vector<std::string>& args);

/// Prints "usage: ...", a short description and the options table (with real defaults).
void print_help(const std::string& usage, const std::string& about, const OptionTable& table);

/// Parses "2GB", "512MB", "1GiB", "1000000" into bytes (decimal GB/MB/KB, binary GiB/MiB/KiB);
/// throws wd::ConfigError naming `option` otherwise.
std::uint64_t parse_size(const std::string& text, const std::string& option);

}  // namespace wd::app
