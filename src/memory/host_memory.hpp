// Host memory of this process (resident set now and at its peak), read from /proc.
#pragma once

#include <cstdint>

namespace wd::memory {

struct HostMemory {
  std::uint64_t rss_bytes = 0;       ///< VmRSS
  std::uint64_t peak_rss_bytes = 0;  ///< VmHWM (high-water mark since start)
};

/// Reads /proc/self/status; zeros where the kernel does not report a field.
HostMemory host_memory();

}  // namespace wd::memory
