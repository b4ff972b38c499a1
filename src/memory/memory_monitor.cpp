// The memory monitor: config, the per-step hook, the rank-0 table and the metrics.jsonl line.
#include "memory/memory_monitor.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/logging.hpp"
#include "memory/host_memory.hpp"

namespace wd::memory {

namespace {

std::string bytes_cell(std::uint64_t bytes) { return format_bytes(static_cast<double>(bytes)); }

nlohmann::json device_json(const compat::DeviceMemory& d) {
  if (!d.available) return nullptr;
  return {{"allocated_bytes", d.allocated_bytes},         {"reserved_bytes", d.reserved_bytes},
          {"peak_allocated_bytes", d.peak_allocated_bytes}, {"peak_reserved_bytes", d.peak_reserved_bytes},
          {"free_bytes", d.free_bytes},                   {"total_bytes", d.total_bytes}};
}

}  // namespace

void MemoryConfig::bind(OptionTable& t) {
  t.bind("memory.report_every", report_every,
         "steps between memory reports (a table from rank 0 and a metrics.jsonl line; 0 = off)")
      .bind("memory.empty_cache_every", empty_cache_every,
            "steps between emptying the CUDA caching allocator (CUDA only, usually slower; 0 = off)");
}

void MemoryConfig::validate(ConfigProblems& p) const {
  p.check(report_every >= 0, "memory.report_every(" + std::to_string(report_every) + ") must be >= 0");
  p.check(empty_cache_every >= 0,
          "memory.empty_cache_every(" + std::to_string(empty_cache_every) + ") must be >= 0");
}

std::string format_memory_table(std::int64_t step, std::int64_t since,
                                const std::vector<MemoryReport>& reports) {
  const bool any_device = std::any_of(reports.begin(), reports.end(),
                                      [](const MemoryReport& r) { return r.device.available; });
  const bool any_lifetime = std::any_of(reports.begin(), reports.end(),
                                        [](const MemoryReport& r) { return r.peak_rss_is_lifetime; });
  std::string table = fmt::format("memory at step {} (peaks since step {}):\n", step, since);
  table += fmt::format("  {:>4}  {:<7}  {:>11}  {:>12}  {:>11}  {:>11}  {:>11}", "rank", "role", "RSS",
                       "peak RSS", "weights", "grads", "optimizer");
  if (any_device) {
    table += fmt::format("  {:>11}  {:>11}  {:>11}  {:>23}", "dev alloc", "dev reserved", "dev peak",
                         "dev free / total");
  }
  for (std::size_t r = 0; r < reports.size(); ++r) {
    const auto& m = reports[r];
    const bool student = m.role == Role::kStudent;
    const auto cat = [&](std::uint64_t b) { return student ? bytes_cell(b) : std::string("-"); };
    table += fmt::format("\n  {:>4}  {:<7}  {:>11}  {:>11}{}  {:>11}  {:>11}  {:>11}", r, role_name(m.role),
                         bytes_cell(m.rss_bytes), bytes_cell(m.peak_rss_bytes),
                         m.peak_rss_is_lifetime ? "*" : " ", cat(m.model.weights_bytes),
                         cat(m.model.grads_bytes), cat(m.model.optimizer_state_bytes));
    if (any_device) {
      const auto& d = m.device;
      if (d.available) {
        table += fmt::format("  {:>11}  {:>11}  {:>11}  {:>23}", bytes_cell(d.allocated_bytes),
                             bytes_cell(d.reserved_bytes), bytes_cell(d.peak_allocated_bytes),
                             bytes_cell(d.free_bytes) + " / " + bytes_cell(d.total_bytes));
      } else {
        table += fmt::format("  {:>11}  {:>11}  {:>11}  {:>23}", "-", "-", "-", "-");
      }
    }
  }
  if (!any_device) table += "\n  device memory: not available (no rank uses a CUDA device)";
  if (any_lifetime) table += "\n  * the kernel refused the peak reset: peak since process start";
  return table;
}

nlohmann::json memory_metrics(std::int64_t step, std::int64_t since, const std::vector<MemoryReport>& reports) {
  auto ranks = nlohmann::json::array();
  for (std::size_t r = 0; r < reports.size(); ++r) {
    const auto& m = reports[r];
    ranks.push_back({{"rank", r},
                     {"role", role_name(m.role)},
                     {"rss_bytes", m.rss_bytes},
                     {"peak_rss_bytes", m.peak_rss_bytes},
                     {"peak_rss_since_step", m.peak_rss_is_lifetime ? 0 : since},
                     {"weights_bytes", m.model.weights_bytes},
                     {"grads_bytes", m.model.grads_bytes},
                     {"optimizer_state_bytes", m.model.optimizer_state_bytes},
                     {"device", device_json(m.device)}});
  }
  return {{"memory_step", step}, {"peaks_since_step", since}, {"ranks", ranks}};
}

std::string memory_metrics_line(std::int64_t step, std::int64_t since,
                                const std::vector<MemoryReport>& reports) {
  return memory_metrics(step, since, reports).dump();
}

MemoryMonitor::MemoryMonitor(MemoryConfig config, Role role, Gather gather, std::string metrics_path)
    : config_(config), role_(role), gather_(std::move(gather)), metrics_(std::move(metrics_path)) {}

MemoryMonitor::MemoryMonitor(MemoryConfig config, Role role, AsyncGather gather, std::string metrics_path)
    : config_(config), role_(role), async_(std::move(gather)), metrics_(std::move(metrics_path)) {}

MemoryMonitor::Gather MemoryMonitor::local_only() {
  return [](std::int64_t, const MemoryReport& mine) { return std::vector<MemoryReport>{mine}; };
}

bool MemoryMonitor::report_due(std::int64_t step) const {
  return config_.report_every > 0 && step > 0 && step % config_.report_every == 0;
}

std::uint64_t MemoryMonitor::lifetime_peak_rss() const {
  return std::max(past_peak_rss_, host_memory().peak_rss_bytes);
}

std::uint64_t MemoryMonitor::sampled_peak_pss() const {
  return std::max(peak_pss_, proportional_set_size());
}

void MemoryMonitor::after_step(std::int64_t step, const c10::Device& device,
                               const std::function<ModelMemory()>& model) {
  if (pending_) {
    if (const auto done = async_.collect(false)) {
      pending_ = false;
      publish(*done, pending_since_);
    }
  }
  if (report_due(step)) report(step, device, model);
  if (config_.empty_cache_every > 0 && step % config_.empty_cache_every == 0 &&
      !compat::empty_device_cache(device) && !empty_cache_warned_) {
    empty_cache_warned_ = true;
    spdlog::warn("memory.empty_cache_every({}) empties the CUDA caching allocator; this rank runs on "
                 "{}: ignored",
                 config_.empty_cache_every, device.str());
  }
}

void MemoryMonitor::report(std::int64_t step, const c10::Device& device,
                           const std::function<ModelMemory()>& model) {
  auto mine = measure_memory(role_, device, model ? model() : ModelMemory{});
  peak_pss_ = std::max(peak_pss_, proportional_set_size());
  mine.peak_rss_is_lifetime = peak_reset_failed_;
  if (async_.post) {
    finish();  // the previous report's gather (long complete unless reports come every few steps)
    async_.post(step, mine);
    pending_ = true;
    pending_since_ = interval_start_;
  } else {
    publish({step, gather_(step, mine)}, interval_start_);
  }
  // Every rank starts its next interval here, after its numbers left: per-interval peaks.
  past_peak_rss_ = std::max(past_peak_rss_, mine.peak_rss_bytes);
  compat::reset_device_peak(device);
  if (!peak_reset_failed_ && !reset_peak_rss()) {
    peak_reset_failed_ = true;
    spdlog::warn("cannot reset the peak RSS (writing 5 to /proc/self/clear_refs failed: {}); "
                 "memory reports show the peak since process start",
                 std::strerror(errno));
  }
  interval_start_ = step;
}

void MemoryMonitor::finish() {
  if (!pending_) return;
  pending_ = false;
  if (const auto done = async_.collect(true)) publish(*done, pending_since_);
}

void MemoryMonitor::publish(const Gathered& g, std::int64_t since) {
  if (g.reports.empty()) return;
  spdlog::info("{}", format_memory_table(g.step, since, g.reports));
  metrics_.append(memory_metrics(g.step, since, g.reports));
}

}  // namespace wd::memory
