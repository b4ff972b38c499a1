// Parsing of the options table from the command line and an INI file, and shared configs.
#include "core/config.hpp"

#include <algorithm>

#include <sstream>
#include <cctype>
#include <torch/torch.h>

#include <fstream>

#include "core/threads.hpp"

namespace wd {

std::string config_value(double value) {
  std::ostringstream os;
  os << value;
  return "(" + os.str() + ")";
}

void ConfigProblems::throw_if_any(const std::string& context) const {
  if (problems_.empty()) return;
  std::string msg = context + ": ";
  for (std::size_t i = 0; i < problems_.size(); ++i) {
    if (i) msg += "; ";
    msg += problems_[i];
  }
  throw ConfigError(msg);
}

std::string OptionTable::to_ini() const {
  std::string top, sections, current;
  for (const auto& [key, value] : values_) {
    const auto dot = key.find('.');
    if (dot == std::string::npos) {
      top += key + " = " + value() + "\n";
      continue;
    }
    const auto section = key.substr(0, dot);
    if (section != current) {
      sections += "\n[" + section + "]\n";
      current = section;
    }
    sections += key.substr(dot + 1) + " = " + value() + "\n";
  }
  return top + sections;
}

void LogConfig::bind(OptionTable& table) {
  table.bind("log.level", level, "log level: trace|debug|info|warn|error|off");
}

void LogConfig::validate(ConfigProblems& problems) const {
  static const std::vector<std::string> kLevels{"trace", "debug", "info", "warn", "error", "off"};
  problems.check(std::find(kLevels.begin(), kLevels.end(), level) != kLevels.end(),
                 "log.level(" + level + ") must be one of trace|debug|info|warn|error|off");
}

void RuntimeConfig::bind(OptionTable& table) {
  table.bind("runtime.threads", threads,
             "LibTorch intra-op threads per process (0 = LibTorch's default)");
}

void RuntimeConfig::bind_roles(OptionTable& table) {
  table.bind("runtime.teacher_threads", teacher_threads,
             "intra-op threads of each teacher rank (0 = runtime.threads, else the node's cores / its ranks)")
      .bind("runtime.student_threads", student_threads,
            "intra-op threads of each student rank (0 = runtime.threads, else the node's cores / its ranks)");
}

void RuntimeConfig::validate(ConfigProblems& problems) const {
  problems.check(threads >= 0, "runtime.threads(" + std::to_string(threads) + ") must be >= 0");
  problems.check(teacher_threads >= 0, "runtime.teacher_threads(" + std::to_string(teacher_threads) + ") must be >= 0");
  problems.check(student_threads >= 0, "runtime.student_threads(" + std::to_string(student_threads) + ") must be >= 0");
}

void RuntimeConfig::apply() const {
  if (threads > 0) set_intra_op_threads(threads);
}

ParsedOptions parse_options(const std::vector<std::string>& args, OptionTable& table,
                            const std::string& positional_name) {
  ParsedOptions parsed;
  po::options_description meta("General");
  meta.add_options()("help,h", "show this help and exit")(
      "config", po::value<std::string>(&parsed.config_file),
      "INI file with the same keys as the flags ([section] key = value); flags win");
  po::options_description all;
  all.add(table.description()).add(meta);
  if (!positional_name.empty()) {
    all.add_options()(positional_name.c_str(),
                      po::value<std::vector<std::string>>(&parsed.positional), "");
  }
  po::positional_options_description pos;
  if (!positional_name.empty()) pos.add(positional_name.c_str(), -1);

  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(all).positional(pos).run(), vm);
  } catch (const po::error& e) {
    throw ConfigError(std::string("command line: ") + e.what());
  }
  if (vm.count("help")) {
    parsed.help = true;
    return parsed;
  }
  if (vm.count("config")) {
    const std::string file = vm["config"].as<std::string>();
    std::ifstream in(file);
    if (!in) throw ConfigError("config file " + file + ": cannot be opened");
    try {
      // store() keeps values already present, so the command line (stored first) wins.
      po::store(po::parse_config_file(in, table.description(), /*allow_unregistered=*/false), vm);
    } catch (const po::error& e) {
      throw ConfigError("config file " + file + ": " + e.what());
    }
  }
  try {
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError(e.what());
  }
  for (const auto& [key, value] : vm) {
    if (!value.defaulted() && key != "config" && key != positional_name) parsed.given.insert(key);
  }
  return parsed;
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

std::vector<std::int64_t> parse_indices(const std::string& text, std::int64_t n, const std::string& option) {
  std::vector<std::int64_t> out;
  std::stringstream in(text);
  std::string item;
  const auto index = [&](const std::string& word, const std::string& item) {
    std::size_t used = 0;
    std::int64_t v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    WD_CHECK_AS(ConfigError, used == word.size() && !word.empty() && v >= 0 && v < n,
                option << "(" << text << "): '" << item << "' is not a sample index or range a-b in 0.." << n - 1);
    return v;
  };
  while (std::getline(in, item, ',')) {
    const auto dash = item.find('-');
    if (dash == std::string::npos) {
      out.push_back(index(item, item));
      continue;
    }
    const auto first = index(item.substr(0, dash), item), last = index(item.substr(dash + 1), item);
    WD_CHECK_AS(ConfigError, first <= last, option << "(" << text << "): range '" << item << "' runs backwards");
    for (auto v = first; v <= last; ++v) out.push_back(v);
  }
  WD_CHECK_AS(ConfigError, !out.empty(), option << "(" << text << ") names no sample");
  return out;
}


}  // namespace wd
