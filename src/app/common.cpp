// Helpers shared by the subcommands: help printing and size parsing.
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <cctype>
#include <iostream>
#include <sstream>

#include "app/commands.hpp"
#include "core/failure.hpp"

namespace wd::app {

void print_help(const std::string& usage, const std::string& about, const OptionTable& table) {
  std::cout << "usage: " << usage << "\n\n" << about << "\n\n" << table.description() << "\n"
            << "General:\n"
            << "  -h [ --help ]          show this help and exit\n"
            << "  --config FILE          INI file with the same keys as the flags ([section] key =\n"
            << "                         value); flags given on the command line win\n";
}

std::uint64_t parse_size(const std::string& text, const std::string& option) {
  std::size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  std::string unit = text.substr(pos);
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double scale = -1;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "KB") scale = 1e3;
  if (unit == "MB") scale = 1e6;
  if (unit == "GB") scale = 1e9;
  if (unit == "TB") scale = 1e12;
  if (unit == "KIB") scale = 1024.0;
  if (unit == "MIB") scale = 1024.0 * 1024;
  if (unit == "GIB") scale = 1024.0 * 1024 * 1024;
  if (unit == "TIB") scale = 1024.0 * 1024 * 1024 * 1024;
  if (pos == 0 || scale < 0 || value <= 0) {
    throw ConfigError(option + "(" + text + ") must be a size such as 2GB, 512MB, 1GiB or 1000000");
  }
  return static_cast<std::uint64_t>(value * scale);
}

std::vector<std::int64_t> parse_dims(const std::string& text, std::size_t count,
                                     const std::string& option) {
  std::vector<std::int64_t> dims;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      dims.push_back(std::stoll(item));
    } catch (const std::exception&) {
      dims.clear();
      break;
    }
  }
  bool ok = dims.size() == count;
  for (auto d : dims) ok = ok && d > 0;
  if (!ok) {
    throw ConfigError(option + "(" + text + ") must be " + std::to_string(count) +
                      " positive integers separated by commas");
  }
  return dims;
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

}  // namespace wd::app
