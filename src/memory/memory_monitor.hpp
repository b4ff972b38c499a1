// MemoryMonitor (`[memory]`): every report_every steps one table from rank 0 with every rank's
// memory, a metrics.jsonl line (and its TensorBoard scalars), and per-interval peaks; optional
// emptying of the CUDA cache.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "memory/memory_config.hpp"
#include "metrics/metrics_writer.hpp"
#include "memory/memory_report.hpp"

namespace wd::memory {

/// The rank's table line / JSON object, the whole table, and the metrics.jsonl line. `since`
/// is the step the peaks were last reset at (0: process start); reports[i] is world rank i.
std::string format_memory_table(std::int64_t step, std::int64_t since,
                                const std::vector<MemoryReport>& reports);
std::string memory_metrics_line(std::int64_t step, std::int64_t since,
                                const std::vector<MemoryReport>& reports);
/// The metrics.jsonl line as a JSON object (what MetricsWriter takes).
nlohmann::json memory_metrics(std::int64_t step, std::int64_t since, const std::vector<MemoryReport>& reports);

class MemoryMonitor {
 public:
  /// Collects every rank's report of training step `step` on the reporting rank: returns them
  /// all (index = world rank) there, an empty vector elsewhere. Collective: every rank calls it
  /// at the same steps. (A callback, so this folder needs no MPI.)
  using Gather = std::function<std::vector<MemoryReport>(std::int64_t step, const MemoryReport&)>;

  /// A gather in two halves, so that no rank waits at a report step for the others (a teacher
  /// runs steps ahead of its students; a blocking gather would drain that lead every report):
  /// `post` hands this rank's report of `step` over and returns; `collect` completes the gather
  /// posted last, blocking when `wait`, otherwise only if it has completed, and returns its step
  /// and, on the reporting rank, every rank's reports (elsewhere none).
  struct Gathered {
    std::int64_t step = 0;
    std::vector<MemoryReport> reports;
  };
  struct AsyncGather {
    std::function<void(std::int64_t step, const MemoryReport&)> post;
    std::function<std::optional<Gathered>(bool wait)> collect;
  };

  /// `metrics_path`, when not empty, receives one JSON line per report and the TensorBoard run
  /// memory/ beside it its scalars (give it on the reporting rank only).
  MemoryMonitor(MemoryConfig config, Role role, Gather gather, std::string metrics_path = "");
  /// With an asynchronous gather: a report is printed when its gather completes (checked after
  /// every step; at the latest when the next report is posted, or at finish()).
  MemoryMonitor(MemoryConfig config, Role role, AsyncGather gather, std::string metrics_path = "");

  /// Completes and prints a report still in flight. Call on every rank once its loop is done.
  void finish();

  /// A gather for one process: returns the local report alone.
  static Gather local_only();

  /// After training step `step` (1-based): when a report is due, measures this rank (the
  /// `model` categories only then; zeros when null), gathers, prints and logs on the reporting
  /// rank, then resets this rank's peaks. Every rank must call it after the same steps.
  /// When emptying is due, empties `device`'s CUDA cache (a warning once on other devices).
  void after_step(std::int64_t step, const c10::Device& device,
                  const std::function<ModelMemory()>& model = {});

  bool report_due(std::int64_t step) const;
  /// This rank's peak RSS since process start: the interval resets hide it from VmHWM.
  std::uint64_t lifetime_peak_rss() const;
  /// The largest PSS read at a memory report or now (PSS has no kernel high-water mark).
  std::uint64_t sampled_peak_pss() const;

 private:
  void report(std::int64_t step, const c10::Device& device, const std::function<ModelMemory()>& model);
  /// Prints and logs a completed gather whose peaks ran since step `since`.
  void publish(const Gathered& g, std::int64_t since);

  MemoryConfig config_;
  Role role_;
  std::uint64_t peak_pss_ = 0;
  Gather gather_;
  AsyncGather async_;
  bool pending_ = false;              ///< an asynchronous gather is in flight
  std::int64_t pending_since_ = 0;    ///< its interval start
  metrics::MetricsWriter metrics_;
  std::int64_t interval_start_ = 0;  ///< step of the last peak reset
  std::uint64_t past_peak_rss_ = 0;  ///< highest peak of the intervals already reset
  bool peak_reset_failed_ = false;   ///< said once; host peaks are then lifetime peaks
  bool empty_cache_warned_ = false;
};

}  // namespace wd::memory
