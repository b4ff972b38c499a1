// Rank-aware spdlog setup and the progress reporter.
#include "core/logging.hpp"

#include <spdlog/sinks/stdout_sinks.h>

#include <array>
#include <cstdio>

#include "core/errors.hpp"

namespace wd {

void init_logging(const Topology& topology, const std::string& level) {
  const auto lvl = spdlog::level::from_str(level);
  // from_str maps unknown names to "off"; only accept "off" when asked for explicitly.
  if (lvl == spdlog::level::off && level != "off") {
    throw ConfigError("log.level(" + level + ") must be one of trace|debug|info|warn|error|off");
  }
  // stderr keeps stdout free for command output (inspect, --help) that users pipe.
  auto logger =
      std::make_shared<spdlog::logger>("wd", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_pattern("[%H:%M:%S.%e] [" + topology.describe() + "] [%l] %v");
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

std::string format_bytes(double bytes) {
  static constexpr std::array<const char*, 5> kUnits{"B", "KiB", "MiB", "GiB", "TiB"};
  std::size_t unit = 0;
  while (bytes >= 1024.0 && unit + 1 < kUnits.size()) {
    bytes /= 1024.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), unit == 0 ? "%.0f %s" : "%.2f %s", bytes, kUnits[unit]);
  return buf;
}

std::string format_shape(c10::IntArrayRef shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

Progress::Progress(std::string what, double total, std::string unit,
                   std::chrono::milliseconds interval)
    : what_(std::move(what)),
      unit_(std::move(unit)),
      total_(total),
      start_(std::chrono::steady_clock::now()),
      last_(start_),
      interval_(interval) {}

void Progress::advance(double delta) {
  done_ += delta;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ >= interval_) {
    last_ = now;
    log_line(false);
  }
}

void Progress::finish() {
  if (logged_ || std::chrono::steady_clock::now() - start_ >= interval_) log_line(true);
}

void Progress::log_line(bool final) {
  logged_ = true;
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = secs > 0 ? done_ / secs : 0.0;
  const bool bytes = unit_ == "bytes";
  const auto amount = [&](double v) {
    return bytes ? format_bytes(v) : fmt::format("{:.0f} {}", v, unit_);
  };
  if (final) {
    spdlog::info("{}: {} in {:.1f} s ({}/s)", what_, amount(done_), secs, amount(rate));
    return;
  }
  const double pct = total_ > 0 ? 100.0 * done_ / total_ : 0.0;
  const double eta = rate > 0 ? (total_ - done_) / rate : 0.0;
  spdlog::info("{}: {} / {} ({:.0f}%), {}/s, ETA {:.0f} s", what_, amount(done_), amount(total_),
               pct, amount(rate), eta);
}

}  // namespace wd
