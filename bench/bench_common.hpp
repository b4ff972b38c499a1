// Helpers the benchmark programs share: timing, medians, /proc/self/status readings, list flags
// and the OpenBLAS thread control.
#pragma once


#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/errors.hpp"

namespace wd::bench {

using Clock = std::chrono::steady_clock;

/// Seconds elapsed since `start`.
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Median of `v` (the mean of the middle two for an even count); 0 for an empty list.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline double min_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}

/// The process's resident memory split the way the kernel counts it: file-backed pages of a
/// mapping that were touched show up in RssFile, copies of the weights in RssAnon.
struct Rss {
  std::int64_t total_kib = 0;  ///< VmRSS
  std::int64_t anon_kib = 0;   ///< RssAnon
  std::int64_t file_kib = 0;   ///< RssFile

  /// Reads /proc/self/status now.
  static Rss now() {
    Rss r;
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      std::string key;
      std::int64_t kib = 0;
      words >> key >> kib;
      if (key == "VmRSS:") r.total_kib = kib;
      if (key == "RssAnon:") r.anon_kib = kib;
      if (key == "RssFile:") r.file_kib = kib;
    }
    return r;
  }
  Rss operator-(const Rss& o) const {
    return {total_kib - o.total_kib, anon_kib - o.anon_kib, file_kib - o.file_kib};
  }
};

/// Splits "1,2, 4" into {"1","2","4"}; empty items are dropped.
inline std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

/// Parses a comma list of positive integers; `flag` names the option in the error.
inline std::vector<int> parse_int_list(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  for (const auto& item : split_list(text)) {
    std::size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v <= 0) {
      throw ConfigError(flag + "(" + text + ") must be a comma list of positive integers");
    }
    out.push_back(v);
  }
  if (out.empty()) throw ConfigError(flag + "(" + text + ") must name at least one value");
  return out;
}

/// The body of every benchmark's main(): runs `run` on the arguments after the program name
/// and turns an error into one line on stderr and exit code 1.
template <typename Run>
int bench_main(const char* name, Run run, int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const wd::Error& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: unexpected error: %s\n", name, e.what());
  }
  return 1;
}

}  // namespace wd::bench
