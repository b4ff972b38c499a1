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

/// The host's MemTotal (/proc/meminfo); 0 where unreadable.
std::uint64_t host_total_bytes();
/// The host's MemAvailable (/proc/meminfo: free plus reclaimable page cache); 0 where unreadable.
std::uint64_t host_available_bytes();

/// Proportional set size of this process (the Pss line of /proc/self/smaps_rollup): each page
/// counted as its share among the processes that map it, so file pages mapped by every rank of
/// a node (a colocated teacher) add up to their size once. 0 where the kernel has no rollup.
std::uint64_t proportional_set_size();

/// glibc's malloc hands large freed blocks back to the kernel (munmap above its mmap threshold, a
/// trim of the heap's top beyond its trim threshold) and the next forward faults the same pages
/// in again: on a CPU teacher rank that was a quarter of its time (8-9 s of system time in a
/// 27 s run, bench/results/throughput.md). Keeps them for reuse instead: every block comes from
/// the heap (no mmapped chunks: glibc's largest mmap threshold, 32 MiB, is below a batch's
/// attention scores), and up to 1 GiB of free heap stays mapped. Called once at process start, before large allocations; false where glibc refused.
bool keep_freed_host_memory();

/// Gives the heap's free memory back to the kernel (malloc_trim): after a failure, so that RSS
/// drops to what is in use and the peak minus the current RSS is what the failed step needed.
void release_free_host_memory();

/// CPU seconds (user + system) this process used so far.
double cpu_seconds();

/// Resets VmHWM to the current RSS by writing "5" to /proc/self/clear_refs (Linux >= 4.0).
/// Returns false when the kernel refuses (older kernel, restricted /proc): VmHWM then keeps
/// the peak since process start. errno tells why.
bool reset_peak_rss();

}  // namespace wd::memory
