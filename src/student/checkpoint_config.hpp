// CheckpointConfig: the `[checkpoint]` section and `--resume`, apart from the training state's
// files (train_state.hpp).
#pragma once

#include <cstdint>
#include <string>

#include "core/config.hpp"

namespace wd::student {

/// `[checkpoint]` section and `--resume`: when training state is saved and where a run resumes.
struct CheckpointConfig {
  std::int64_t every = 0;  ///< steps between checkpoints; 0 = only at the end and on SIGUSR1
  std::int64_t keep = 3;   ///< newest checkpoints kept; 0 = all
  std::string dir;         ///< empty: <run-dir>/checkpoints
  std::string resume;      ///< "" = start fresh, "auto" = newest good checkpoint if any, or a path

  void bind(OptionTable& t);
  void validate(ConfigProblems& p) const;
};

}  // namespace wd::student
