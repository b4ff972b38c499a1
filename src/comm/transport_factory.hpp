// Chooses the teacher -> student transport for a device: NCCL for CUDA tensors where the build
// has it, MPI for host tensors.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "comm/process_groups.hpp"
#include "comm/transport.hpp"

namespace wd::comm {

/// True when this build can stream CUDA tensors over NCCL (a CUDA LibTorch and NCCL found).
bool nccl_transport_built();

/// The transport for tensors on `device` over `groups.link()`: NCCL for a CUDA device (throws
/// wd::ConfigError "this build has no CUDA LibTorch/NCCL" when the build lacks it), MPI for a
/// CPU device. Logs which one it chose and why. Collective over the link.
std::unique_ptr<Transport> make_transport(const ProcessGroups& groups, int world_rank,
                                          const MessageSpec& spec, const CommConfig& config,
                                          std::int64_t first_step, std::int64_t end_step,
                                          const c10::Device& device);

/// The NCCL implementation (nccl_transport.cpp, compiled only with a CUDA LibTorch and NCCL):
/// one NCCL communicator per link, a ring of prefetch_depth device buffers, sends and receives
/// on a dedicated stream ordered by CUDA events against torch's current stream.
std::unique_ptr<Transport> make_nccl_transport(const ProcessGroups& groups, int world_rank,
                                               const MessageSpec& spec, const CommConfig& config,
                                               std::int64_t first_step, std::int64_t end_step,
                                               const c10::Device& device);

}  // namespace wd::comm
