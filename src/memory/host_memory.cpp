// /proc/self/status parsing for RSS and peak RSS.
#include "memory/host_memory.hpp"

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

}  // namespace wd::memory
