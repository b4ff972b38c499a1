// MemoryConfig: the `[memory]` section (memory reports, CUDA cache emptying), apart from the
// monitor.
#pragma once

#include <cstdint>

#include "core/config.hpp"

namespace wd::memory {

/// `[memory]` section of the config.
struct MemoryConfig {
  std::int64_t report_every = 50;      ///< steps between reports; 0 = off
  std::int64_t empty_cache_every = 0;  ///< steps between CUDA emptyCache calls; 0 = off

  void bind(OptionTable& t);
  void validate(ConfigProblems& p) const;
};

}  // namespace wd::memory
