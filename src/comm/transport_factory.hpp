// Chooses what carries each stream (the teacher -> student link, the links between shard
// stages): NCCL where both ends hold CUDA tensors on distinct GPUs and the build has it, MPI
// (pinned host staging for CUDA ends) otherwise.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "comm/backend_choice.hpp"
#include "comm/process_groups.hpp"
#include "comm/transport.hpp"

namespace wd::comm {

/// The transport of one end of a stream, for a rank whose tensors are on `device`. Every rank
/// of `end.comm` gathers the stream's devices and applies choose_backend(config.backend, ...),
/// so all agree; the sending end logs the choice and why. Over MPI, a CUDA receiver gets its
/// messages on the device (pinned host ring, then StagingTransport); a CUDA sender's tensors
/// are copied into pinned host buffers. Collective over `end.comm`. Throws ConfigError when
/// comm.backend nccl cannot work for the stream.
std::unique_ptr<Transport> make_stream(const StreamEnd& end, const MessageSpec& spec,
                                       const CommConfig& config, std::int64_t first_step,
                                       std::int64_t end_step, const c10::Device& device);

/// make_stream on `world_rank`'s end of its replica's teacher -> student link.
std::unique_ptr<Transport> make_transport(const ProcessGroups& groups, int world_rank,
                                          const MessageSpec& spec, const CommConfig& config,
                                          std::int64_t first_step, std::int64_t end_step,
                                          const c10::Device& device);

/// A pipeline stage's links to its neighbours in the replica (teacher.placement = shard): the
/// previous stage's stream in (null on the first stage), the stream to the next stage out (null
/// on the last). Same ring, checks, deadlines and health polling as the student stream.
struct StageTransports {
  std::unique_ptr<Transport> from_previous;  ///< recv/release
  std::unique_ptr<Transport> to_next;        ///< send/flush
};

/// The stage links of teacher `world_rank` (make_stream on each). The link from the previous
/// stage is made first: every link's two stages make it in the same order, stage by stage.
StageTransports make_stage_transports(const ProcessGroups& groups, int world_rank,
                                      const MessageSpec& from_previous, const MessageSpec& to_next,
                                      const CommConfig& config, std::int64_t first_step,
                                      std::int64_t end_step, const c10::Device& device);

/// The NCCL implementation of one end (nccl_transport.cpp, compiled only with a CUDA LibTorch
/// and NCCL; elsewhere it throws ConfigError): one NCCL communicator per stream, a ring of
/// prefetch_depth device buffers, sends and receives on a dedicated stream ordered by CUDA
/// events against torch's current stream.
std::unique_ptr<Transport> make_nccl_stream(const StreamEnd& end, const MessageSpec& spec,
                                            const CommConfig& config, std::int64_t first_step,
                                            std::int64_t end_step, const c10::Device& device);

}  // namespace wd::comm
