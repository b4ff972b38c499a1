// Host memory of this process (resident set now and at its peak), read from /proc, and the
// reset of the peak that makes per-interval peaks possible.
#pragma once

#include <cstdint>

namespace wd::memory {

struct HostMemory {
  std::uint64_t rss_bytes = 0;       ///< VmRSS
  std::uint64_t peak_rss_bytes = 0;  ///< VmHWM (high-water mark since start or the last reset)
};

/// Reads /proc/self/status; zeros where the kernel does not report a field.
HostMemory host_memory();

/// The host's MemTotal and MemAvailable (/proc/meminfo); 0 where unreadable.
std::uint64_t host_total_bytes();
std::uint64_t host_available_bytes();

/// Proportional set size of this process (the Pss line of /proc/self/smaps_rollup): each page
/// counted as its share among the processes that map it, so file pages mapped by every rank of
/// a node (a colocated teacher) add up to their size once. 0 where the kernel has no rollup.
std::uint64_t proportional_set_size();

/// CPU seconds (user + system) this process used so far.
double cpu_seconds();

/// Resets VmHWM to the current RSS by writing "5" to /proc/self/clear_refs (Linux >= 4.0).
/// Returns false when the kernel refuses (older kernel, restricted /proc): VmHWM then keeps
/// the peak since process start. errno tells why.
bool reset_peak_rss();

}  // namespace wd::memory
