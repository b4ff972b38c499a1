// The config mechanism: component structs bound into one Boost.Program_options table,
// parsed from the command line and an INI file (`--config`), then validated once.
#pragma once

#include <boost/program_options.hpp>

#include <cstdint>
#include <functional>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/errors.hpp"

namespace wd {

namespace po = boost::program_options;

/// The names of a closed choice's values: an enum E declares, in its own namespace,
/// `const std::vector<std::pair<E, const char*>>& choices(E);` (found by argument-dependent
/// lookup), and OptionTable::bind binds a field of type E to them.
template <typename E>
const char* name_of(E value) {
  for (const auto& [v, name] : choices(E{})) {
    if (v == value) return name;
  }
  return "?";
}

/// The names of E's values joined by `sep`.
template <typename E>
std::string choice_names(E, const std::string& sep = ", ") {
  std::string out;
  for (const auto& [v, name] : choices(E{})) out += (out.empty() ? "" : sep) + std::string(name);
  return out;
}

/// A closed choice written as its name (streams: error messages, INI files).
template <typename E, typename = std::enable_if_t<std::is_enum_v<E>>, typename = decltype(choices(E{}))>
std::ostream& operator<<(std::ostream& os, E value) {
  return os << name_of(value);
}

/// The value of E named `text`; a ConfigError naming `key` and every name otherwise.
template <typename E>
E parse_choice(const std::string& key, const std::string& text) {
  for (const auto& [v, name] : choices(E{})) {
    if (text == name) return v;
  }
  throw ConfigError(key + "(" + text + ") must be one of " + choice_names(E{}));
}

/// One options table. Keys are grouped by component with Program_options' own convention:
/// `[teacher]` / `placement = stream` in the INI file is `--teacher.placement stream` on the
/// command line. Each option writes straight into a config struct field, and the default that
/// `--help` prints is that field's value at bind time, so help and code cannot drift apart.
class OptionTable {
 public:
  explicit OptionTable(const std::string& caption) : desc_(caption, 100, 50) {}

  /// Binds `--key` to `field`.
  template <typename T, std::enable_if_t<!std::is_enum_v<T>, int> = 0>
  OptionTable& bind(const std::string& key, T& field, const std::string& help) {
    desc_.add_options()(key.c_str(), po::value<T>(&field)->default_value(field, show(field)),
                        help.c_str());
    values_.push_back({key, [&field] { return show_plain(field); }});
    return *this;
  }

  /// Binds a closed choice (an enum with `choices`): --help lists its names, and any other name
  /// is a ConfigError when the options are parsed.
  template <typename E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
  OptionTable& bind(const std::string& key, E& field, const std::string& help) {
    desc_.add_options()(key.c_str(),
                        po::value<std::string>()
                            ->default_value(name_of(field))
                            ->notifier([key, &field](const std::string& text) { field = parse_choice<E>(key, text); }),
                        (help + " (one of: " + choice_names(E{}, " | ") + ")").c_str());
    values_.push_back({key, [&field] { return std::string(name_of(field)); }});
    return *this;
  }

  /// Binds a field of a type parsed from its text: `parse` runs when the options are parsed (its
  /// ConfigError stops the parse) and `show` writes the field back (the help's default, INI files).
  template <typename T>
  OptionTable& bind_parsed(const std::string& key, T& field, std::function<T(const std::string&)> parse,
                           std::function<std::string(const T&)> show, const std::string& help) {
    desc_.add_options()(key.c_str(),
                        po::value<std::string>()
                            ->default_value(show(field))
                            ->notifier([&field, parse](const std::string& text) { field = parse(text); }),
                        help.c_str());
    values_.push_back({key, [&field, show] { return show(field); }});
    return *this;
  }

  /// Binds a boolean: `--key`, `--key true|false` on the command line, `key = true` in INI.
  OptionTable& bind(const std::string& key, bool& field, const std::string& help) {
    desc_.add_options()(key.c_str(),
                        po::value<bool>(&field)
                            ->default_value(field, field ? "true" : "false")
                            ->implicit_value(true, "true"),
                        help.c_str());
    values_.push_back({key, [&field] { return std::string(field ? "true" : "false"); }});
    return *this;
  }

  /// Binds an option that must be given (no default).
  OptionTable& require(const std::string& key, std::string& field, const std::string& help) {
    desc_.add_options()(key.c_str(), po::value<std::string>(&field)->required(),
                        (help + " (required)").c_str());
    values_.push_back({key, [&field] { return field; }});
    return *this;
  }

  /// Adds the options of another table as a titled group.
  OptionTable& add(const OptionTable& other) {
    desc_.add(other.desc_);
    return *this;
  }

  /// The current values as an INI file that --config reads back: top-level keys first, then
  /// one [section] per component.
  std::string to_ini() const;

  po::options_description& description() { return desc_; }
  const po::options_description& description() const { return desc_; }

 private:
  template <typename T>
  static std::string show(const T& v) {
    std::ostringstream os;
    os << v;
    return os.str();
  }
  static std::string show(const std::string& v) { return v.empty() ? "\"\"" : v; }
  template <typename T>
  static std::string show_plain(const T& v) {
    std::ostringstream os;
    os << v;
    return os.str();
  }
  po::options_description desc_;
  std::vector<std::pair<std::string, std::function<std::string()>>> values_;
};

/// Collects every invalid value of a config, then throws one wd::ConfigError listing them all,
/// each with its value: "teacher.ranks(0) must be >= 1; train.steps(-3) must be >= 0".
class ConfigProblems {
 public:
  /// Records `message` when `ok` is false.
  void check(bool ok, const std::string& message) {
    if (!ok) problems_.push_back(message);
  }
  bool empty() const { return problems_.empty(); }
  const std::vector<std::string>& list() const { return problems_; }
  /// Throws wd::ConfigError("<context>: p1; p2; ...") when anything was recorded.
  void throw_if_any(const std::string& context) const;

 private:
  std::vector<std::string> problems_;
};

/// A value as a problem names it after its key: "(0.5)" in "train.lr(0.5) must be > 0".
std::string config_value(double value);

/// Options every subcommand shares.
struct LogConfig {
  std::string level = "info";
  void bind(OptionTable& table);
  void validate(ConfigProblems& problems) const;
};

struct RuntimeConfig {
  int threads = 0;  ///< intra-op threads for LibTorch; 0 = LibTorch's default
  /// `train` only: the threads of teacher / student ranks; 0 = runtime.threads, or the node's
  /// cores shared out over its ranks when that is 0 too.
  int teacher_threads = 0;
  int student_threads = 0;
  void bind(OptionTable& table);
  /// Binds teacher_threads and student_threads (commands with roles).
  void bind_roles(OptionTable& table);
  void validate(ConfigProblems& problems) const;
  /// Applies the thread setting to LibTorch.
  void apply() const;
};

/// Outcome of parsing: `help` is true when --help was given (nothing else is checked then).
struct ParsedOptions {
  bool help = false;
  std::string config_file;
  std::vector<std::string> positional;
  /// The keys given a value on the command line or in the --config file; the others kept their
  /// bound default (a command whose default depends on the model asks this before taking it).
  std::set<std::string> given;
};

/// Parses `args` (the words after the subcommand) into the fields bound in `table`, then the
/// INI file named by `--config` if any; values on the command line win over the file. Adds
/// `--help` and `--config` itself. `positional_name`, when not empty, collects bare words.
/// Throws wd::ConfigError naming the option (and the file) on unknown or malformed options.
ParsedOptions parse_options(const std::vector<std::string>& args, OptionTable& table,
                            const std::string& positional_name = "");

/// Parses "2GB", "512MB", "1GiB", "1000000" into bytes (decimal TB/GB/MB/KB, binary TiB/GiB/MiB/KiB);
/// throws wd::ConfigError naming `option` otherwise.
std::uint64_t parse_size(const std::string& text, const std::string& option);

/// Parses "a,b,c" into exactly `count` positive integers; throws wd::ConfigError naming `option`.
std::vector<std::int64_t> parse_dims(const std::string& text, std::size_t count, const std::string& option);

/// Parses "0,3,7" or "10-15,20" into sample indices, each in [0, n); throws wd::ConfigError
/// naming `option` otherwise.
std::vector<std::int64_t> parse_indices(const std::string& text, std::int64_t n, const std::string& option = "samples");

}  // namespace wd
