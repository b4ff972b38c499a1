// CommConfig: the `[comm]` section of the config (prefetch, deadlines, mode, buckets, backend).
#pragma once

#include <cstdint>
#include <string>

#include "core/choices.hpp"
#include "core/config.hpp"

namespace wd::comm {

/// `[comm]` section of the config.
struct CommConfig {
  int prefetch_depth = 2;          ///< batches a teacher may run ahead / a student posts ahead
  double timeout_s = 120.0;        ///< deadline of every wait
  CommMode mode = CommMode::kScatter;  ///< scatter: each student its slice | broadcast: all the same
  double bucket_mb = 25.0;         ///< gradient all-reduce bucket size
  double watchdog_s = 0;           ///< 0: 2 x timeout_s + 90
  CommBackend backend = CommBackend::kAuto;  ///< backend_choice.hpp
  /// Binds every field to its `comm.*` option.
  void bind(OptionTable& table);
  /// Seconds without progress after which the watchdog ends the rank.
  double watchdog_limit() const;
  /// bucket_mb in bytes, for GradientReducer.
  std::uint64_t bucket_bytes() const;
  /// Adds a problem, naming the value, for every field out of range.
  void validate(ConfigProblems& problems) const;
};

}  // namespace wd::comm
