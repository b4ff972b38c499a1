// /proc/self/status parsing for RSS and peak RSS; /proc/self/clear_refs for the peak reset.
#include "memory/host_memory.hpp"

#include <fcntl.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>

#include <fstream>
#include <sstream>
#include <string>

namespace wd::memory {

namespace {

/// Calls `take(key, bytes)` for every "Key: N kB" line of the /proc file `path` (a line whose
/// second field is no number gives 0 bytes).
template <typename Take>
void for_each_kib_field(const char* path, Take&& take) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string key;
    std::uint64_t kib = 0;
    fields >> key >> kib;
    take(key, kib * 1024);
  }
}

/// One field of /proc/meminfo in bytes ("MemTotal:"), 0 when it is missing.
std::uint64_t meminfo(const std::string& field) {
  std::uint64_t value = 0;
  for_each_kib_field("/proc/meminfo", [&](const std::string& key, std::uint64_t bytes) {
    if (key == field) value = bytes;
  });
  return value;
}

}  // namespace

HostMemory host_memory() {
  HostMemory m;
  for_each_kib_field("/proc/self/status", [&](const std::string& key, std::uint64_t bytes) {
    if (key == "VmRSS:") m.rss_bytes = bytes;
    if (key == "VmHWM:") m.peak_rss_bytes = bytes;
  });
  return m;
}

bool keep_freed_host_memory() {
  // Both at once: setting either one turns off glibc's dynamic mmap threshold, and a trim
  // threshold alone would leave the mmap threshold at 128 KiB (every activation mmapped and
  // unmapped: three times the system time, bench/results/throughput.md).
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  // 32 MiB is the largest threshold glibc takes, and a batch's attention scores pass it (8
  // heads x 512^2 tokens x 4 samples in fp32): with no mmapped chunks at all they come from
  // the heap too (a batch-4 `small` forward 1440 -> 1205 ms, system time 1.15 -> 0.25 s).
  // malloc_trim still hands free pages anywhere in the heap back (release_free_host_memory).
  const bool mmap_off = mallopt(M_MMAP_MAX, 0) == 1;
  return mmap_set && trim_set && mmap_off;
}

void release_free_host_memory() { malloc_trim(0); }

std::uint64_t host_total_bytes() { return meminfo("MemTotal:"); }

std::uint64_t host_available_bytes() { return meminfo("MemAvailable:"); }

std::uint64_t proportional_set_size() {
  std::uint64_t pss = 0;
  for_each_kib_field("/proc/self/smaps_rollup", [&](const std::string& key, std::uint64_t bytes) {
    if (key == "Pss:") pss = bytes;
  });
  return pss;
}

double cpu_seconds() {
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  const auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

bool reset_peak_rss() {
  // A raw write: the kernel reports an unsupported value as EINVAL from write(2), which a
  // buffered stream would only surface (if at all) at close.
  const int fd = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "5", 1) == 1;
  const int write_errno = errno;
  ::close(fd);
  errno = write_errno;  // the caller's message names why the write failed, not the close
  return ok;
}

}  // namespace wd::memory
