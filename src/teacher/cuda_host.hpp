// Host memory and the CUDA runtime, behind the CUDA/no-CUDA split of the copy engines
// (cuda_copy_engine.cpp; no_cuda_copy_engine.cpp answers for builds without the toolkit).
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace wd::teacher {

/// cudaHostRegister (portable) of [data, data + bytes): copies from it are then DMA. False,
/// with `why`, where CUDA refuses or the build has no CUDA toolkit.
bool cuda_host_register(void* data, std::size_t bytes, std::string& why);
/// cudaHostUnregister of a range registered above; never throws.
void cuda_host_unregister(void* data) noexcept;

/// Host-to-device bandwidth of `device` in GB/s (1e9 bytes/s): the best of `runs` copies of
/// `bytes` from pinned (cudaHostAlloc) memory, timed with CUDA events on a side stream.
/// Throws wd::Error in builds without the CUDA toolkit.
double measure_h2d_gbps(const c10::Device& device, std::uint64_t bytes, int runs);

}  // namespace wd::teacher
