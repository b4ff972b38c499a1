// The --device flag of the benchmarks that run on the host or a CUDA device: its check (a clear
// error when CUDA is asked for and cannot be used) and the device it names.
#pragma once

#include <torch/torch.h>

#include <string>

#include "core/config.hpp"
#include "core/torch_compat.hpp"

namespace wd::bench {

/// Records in `p` why `device` (the flag's text) cannot be used here: not cpu / cuda / cuda:N,
/// CUDA asked for from a LibTorch built without it or on a machine with no usable device, or an
/// index past the devices this process sees.
inline void check_bench_device(ConfigProblems& p, const std::string& device) {
  c10::Device d(c10::kCPU);
  try {
    d = c10::Device(device);
  } catch (const c10::Error&) {
    p.check(false, "device(" + device + ") must be cpu, cuda or cuda:N");
    return;
  }
  if (d.is_cpu()) return;
  if (!d.is_cuda()) {
    p.check(false, "device(" + device + ") must be cpu, cuda or cuda:N");
    return;
  }
  if (!compat::kHasCuda) {
    p.check(false, "device(" + device + "): CUDA was asked for, but this LibTorch (" +
                       std::string(compat::torch_version()) +
                       ") was built without CUDA; build against a CUDA LibTorch or use --device cpu");
    return;
  }
  if (!compat::cuda_available()) {
    p.check(false, "device(" + device + "): CUDA was asked for, but no CUDA device is usable here "
                   "(no GPU, no driver, or CUDA_VISIBLE_DEVICES hides them); use --device cpu");
    return;
  }
  const auto count = static_cast<int>(torch::cuda::device_count());
  p.check(!d.has_index() || d.index() < count,
          "device(" + device + "): this process sees " + std::to_string(count) + " CUDA device(s)");
}

/// The device `device` names, with CUDA's index made explicit (cuda -> cuda:0) so that the
/// allocator's statistics and the stream synchronisation address one device.
inline c10::Device bench_device(const std::string& device) {
  c10::Device d(device);
  if (d.is_cuda() && !d.has_index()) d = c10::Device(c10::kCUDA, 0);
  return d;
}

}  // namespace wd::bench
