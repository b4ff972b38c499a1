// Chooses the teacher -> student transport for a link: NCCL where both ends hold CUDA tensors
// on distinct GPUs and the build has it, MPI (pinned host staging for CUDA ends) otherwise.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "comm/backend_choice.hpp"
#include "comm/process_groups.hpp"
#include "comm/transport.hpp"

namespace wd::comm {

/// The transport over `groups.link()` for a rank whose tensors are on `device`. Every rank of
/// the link gathers the link's devices and applies choose_backend(config.backend, ...), so all
/// agree; the link's teacher logs the choice and why. Over MPI, a CUDA student receives into
/// pinned host buffers and gets its messages on the device (StagingTransport); a CUDA teacher's
/// outputs are copied into pinned host buffers. Collective over the link. Throws ConfigError
/// when comm.backend nccl cannot work for the link.
std::unique_ptr<Transport> make_transport(const ProcessGroups& groups, int world_rank,
                                          const MessageSpec& spec, const CommConfig& config,
                                          std::int64_t first_step, std::int64_t end_step,
                                          const c10::Device& device);

/// The NCCL implementation (nccl_transport.cpp, compiled only with a CUDA LibTorch and NCCL;
/// elsewhere it throws ConfigError): one NCCL communicator per link, a ring of prefetch_depth
/// device buffers, sends and receives on a dedicated stream ordered by CUDA events against
/// torch's current stream.
std::unique_ptr<Transport> make_nccl_transport(const ProcessGroups& groups, int world_rank,
                                               const MessageSpec& spec, const CommConfig& config,
                                               std::int64_t first_step, std::int64_t end_step,
                                               const c10::Device& device);

}  // namespace wd::comm
