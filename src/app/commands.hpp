// The subcommands of the wan-distill executable (exit codes: core/failure.hpp).
#pragma once

#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/failure.hpp"

namespace wd::app {

/// Each takes the words after the subcommand name and returns an exit code; errors propagate
/// as wd::Error subclasses to main, which maps them to exit codes.
int run_convert(const std::vector<std::string>& args);
int run_forward(const std::vector<std::string>& args);
int run_init_teacher(const std::vector<std::string>& args);
int run_inspect(const std::vector<std::string>& args);
int run_train(const std::vector<std::string>& args);
int run_generate(const std::vector<std::string>& args);
int run_plan(const std::vector<std::string>& args);
int run_make_dataset(const std::vector<std::string>& args);
int run_layout(const std::vector<std::string>& args);
int run_sample(const std::vector<std::string>& args);
int run_evaluate(const std::vector<std::string>& args);

/// Prints "usage: ...", a short description and the options table (with real defaults).
void print_help(const std::string& usage, const std::string& about, const OptionTable& table);

}  // namespace wd::app
