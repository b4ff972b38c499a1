// Host synchronisations on the training path, counted: every place that makes the host wait for
// a device (a tensor read on the host, a stream synchronise) goes through here, so a test can
// count them per step and they do not creep back (issue 23, part 2).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace wd {

/// Host synchronisations counted in this process since start (all threads).
std::int64_t host_sync_count();

/// Counts one host synchronisation at `where` (a short static label, for a debugger or a log).
void note_host_sync(const char* where);

/// `t.item<T>()`, counted: on a CUDA tensor this waits for the device.
template <typename T>
T read_scalar(const torch::Tensor& t, const char* where) {
  note_host_sync(where);
  return t.item<T>();
}

}  // namespace wd
