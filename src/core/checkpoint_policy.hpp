// CheckpointPolicy: which student blocks recompute their activations in the backward
// (`student.checkpointing`), parsed once when the options are (student_config.cpp binds it). In
// core so that the memory diagnosis reads the policy itself, not a copy of its text.
#pragma once

#include <cstdint>
#include <string>

namespace wd {

/// Which blocks keep only their inputs in the forward and recompute the rest in the backward:
/// `off`, `all`, or `every:k` (blocks whose index is a multiple of k).
struct CheckpointPolicy {
  enum class Mode { kOff, kAll, kEvery };
  Mode mode = Mode::kOff;
  std::int64_t every = 0;  ///< k of every:k (>= 1); 0 otherwise

  /// Parses `off | all | every:k`; throws wd::ConfigError naming `student.checkpointing(<value>)`.
  static CheckpointPolicy parse(const std::string& text);
  /// True when block `block` is checkpointed.
  bool applies(std::int64_t block) const;
  /// The spelling parse accepts: "off", "all", "every:2".
  std::string str() const;
};

}  // namespace wd
