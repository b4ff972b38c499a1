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

HostMemory host_memory() {
  HostMemory m;
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string key;
    std::uint64_t kib = 0;
    fields >> key >> kib;
    if (key == "VmRSS:") m.rss_bytes = kib * 1024;
    if (key == "VmHWM:") m.peak_rss_bytes = kib * 1024;
  }
  return m;
}

namespace {

/// One field of /proc/meminfo in bytes ("MemTotal:"), 0 when it is missing.
std::uint64_t meminfo(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string key;
    std::uint64_t kib = 0;
    fields >> key >> kib;
    if (key == field) return kib * 1024;
  }
  return 0;
}

}  // namespace

bool keep_freed_host_memory() {
  // Both at once: setting either one turns off glibc's dynamic mmap threshold, and a trim
  // threshold alone would leave the mmap threshold at 128 KiB (every activation mmapped and
  // unmapped: three times the system time, bench/results/throughput.md).
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return mmap_set && trim_set;
}

void release_free_host_memory() { malloc_trim(0); }

std::uint64_t host_total_bytes() { return meminfo("MemTotal:"); }

std::uint64_t host_available_bytes() { return meminfo("MemAvailable:"); }

std::uint64_t proportional_set_size() {
  std::ifstream in("/proc/self/smaps_rollup");
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string key;
    std::uint64_t kib = 0;
    fields >> key >> kib;
    if (key == "Pss:") return kib * 1024;
  }
  return 0;
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
