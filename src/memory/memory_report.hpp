// MemoryReport: one rank's memory at a report step (host, device, the student's own categories),
// and the byte counts of those categories.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/topology.hpp"
#include "core/torch_compat.hpp"

namespace wd::memory {

/// What the student's own tensors take; zeros on teacher ranks.
struct ModelMemory {
  std::uint64_t weights_bytes = 0;          ///< trained parameters
  std::uint64_t grads_bytes = 0;            ///< their .grad tensors (those allocated)
  std::uint64_t optimizer_state_bytes = 0;  ///< e.g. AdamW's exp_avg + exp_avg_sq per parameter
};

/// One rank's memory. Fixed-size and trivially copyable: ranks gather it as raw bytes.
struct MemoryReport {
  Role role = Role::kTeacher;
  /// True when the kernel refused the peak reset: peak_rss_bytes is then the peak since
  /// process start, not since the previous report.
  bool peak_rss_is_lifetime = false;
  std::uint64_t rss_bytes = 0;
  std::uint64_t peak_rss_bytes = 0;
  std::uint64_t host_total_bytes = 0;  ///< the node's memory (MemTotal)
  compat::DeviceMemory device;  ///< device.available is false on CPU ranks
  ModelMemory model;
  std::uint64_t teacher_weights_bytes = 0;  ///< the frozen teacher (teacher ranks)
  std::uint64_t transport_bytes = 0;        ///< the batch stream's preallocated buffers
};
static_assert(std::is_trivially_copyable_v<MemoryReport>, "MemoryReport is gathered as bytes");

/// Measures this process now: host RSS and peak, `device`'s allocator (when it is a CUDA
/// device of a CUDA build), and the `model` categories the caller counted.
MemoryReport measure_memory(Role role, const c10::Device& device, const ModelMemory& model = {});

/// Sum of the bytes of the defined tensors in `tensors`.
std::uint64_t tensor_bytes(const std::vector<torch::Tensor>& tensors);
/// Sum of the bytes of the allocated .grad of `params`.
std::uint64_t grad_bytes(const std::vector<torch::Tensor>& params);
/// Sum of the bytes of the per-parameter state tensors of an Adam or AdamW optimizer (exp_avg,
/// exp_avg_sq, and max_exp_avg_sq with amsgrad); 0 before its first step and for other
/// optimizers.
std::uint64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace wd::memory
