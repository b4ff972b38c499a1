// MetricsWriter: a run's metrics as JSON lines (metrics.jsonl) and, scalar for scalar, as
// TensorBoard event files (tensorboard/<run>/ beside it); docs/metrics.md.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "metrics/event_file_writer.hpp"

namespace wd::metrics {

/// The TensorBoard view of one metrics.jsonl line.
struct MetricScalars {
  std::string run;  ///< "train", "eval" or "memory"; empty: the line has no scalars to show
  std::int64_t step = 0;
  std::vector<EventScalar> scalars;
};

/// The line's step field names its run and step: "step" -> train, "eval_step" -> eval,
/// "memory_step" -> memory. Every other number becomes a scalar tagged "<run>/<field>", nested
/// objects add their key ("memory/rank1/device/allocated_bytes"), an array's elements are named
/// "rank<N>" after their "rank" field (their index without one) in place of the array's key.
/// Fields whose name ends in "step" are steps, not measurements, and strings, booleans and
/// nulls have no scalar: all of those are left out.
MetricScalars metric_scalars(const nlohmann::json& line);

/// One writer of metrics lines (a process may hold several, each writing its own runs).
/// Move-only: it owns its event files.
class MetricsWriter {
 public:
  /// Appends to `jsonl_path` and writes tensorboard/<run>/ in its directory; with an empty
  /// path, append() does nothing (ranks that log no metrics).
  explicit MetricsWriter(std::string jsonl_path);

  /// Appends `line` to metrics.jsonl with one write(2) on an O_APPEND descriptor (writers
  /// sharing the file never interleave) and its scalars to the event file of its run, created
  /// at the run's first line in this process with a SessionLog START at that line's step.
  /// Never throws: a file that cannot be written is named in one warning and then skipped.
  void append(const nlohmann::json& line);

 private:
  std::string jsonl_path_;
  std::string tensorboard_dir_;
  bool jsonl_warned_ = false;
  /// Per run: its open event file, or nullopt once it failed (warned then).
  std::map<std::string, std::optional<EventFileWriter>> runs_;
};

}  // namespace wd::metrics
