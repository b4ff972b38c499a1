// Helpers shared by the subcommands: help printing and size parsing.
#include <cctype>
#include <iostream>

#include "app/commands.hpp"

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
  if (pos == 0 || scale < 0 || value <= 0) {
    throw ConfigError(option + "(" + text + ") must be a size such as 2GB, 512MB, 1GiB or 1000000");
  }
  return static_cast<std::uint64_t>(value * scale);
}

}  // namespace wd::app
