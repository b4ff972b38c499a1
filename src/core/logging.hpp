// Rank-aware logging on spdlog, and a throttled progress reporter for long work.
#pragma once

#include <c10/util/ArrayRef.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "core/topology.hpp"

namespace wd {

/// Installs the default logger: every line is "[12:00:01.234] [rank 3/16 student] [info] ...".
/// `level` is one of trace, debug, info, warn, error, off; throws wd::ConfigError otherwise.
void init_logging(const Topology& topology, const std::string& level);

/// Logs "<what>: done/total unit (pct%), rate, ETA" at most every `interval` and once at the end,
/// so anything that takes more than a few seconds shows it is alive.
class Progress {
 public:
  Progress(std::string what, double total, std::string unit,
           std::chrono::milliseconds interval = std::chrono::milliseconds(2000));
  /// Advances by `delta` units and logs when the interval has passed.
  void advance(double delta);
  /// Logs the final line (always, if the work took longer than one interval).
  void finish();

 private:
  void log_line(bool final);
  std::string what_;
  std::string unit_;
  double total_;
  double done_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_;
  std::chrono::milliseconds interval_;
  bool logged_ = false;
};

/// "1.50 GiB" style formatting of a byte count.
std::string format_bytes(double bytes);

/// "[2,16,3,8,8]": a shape as error messages print it.
std::string format_shape(c10::IntArrayRef shape);

}  // namespace wd
