// Chooses what carries each stream (the teacher -> student link, the links between shard
// stages): NCCL where both ends hold CUDA tensors on distinct GPUs and the build has it, MPI
// (pinned host staging for CUDA ends) otherwise; and makes that end's Sender or Receiver.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "comm/backend_choice.hpp"
#include "comm/comm_config.hpp"
#include "comm/message_spec.hpp"
#include "comm/process_groups.hpp"
#include "comm/receiver.hpp"
#include "comm/sender.hpp"
#include "comm/stream_end.hpp"

namespace wd::comm {

class HealthChannel;

/// The sending end `end` of a stream, for a rank whose tensors are on `device`. Every rank of
/// `end.comm` gathers the stream's devices and applies choose_backend(config.backend, ...), so
/// all agree; the sender logs the choice and why. Over MPI a CUDA sender's tensors are copied
/// into pinned host buffers. Every wait, set-up included, polls `health` (null: none).
/// Collective over `end.comm`. Throws ConfigError when comm.backend nccl cannot work for the
/// stream, wd::Error when `end` is not a sending end.
std::unique_ptr<Sender> make_sender(const StreamEnd& end, const MessageSpec& spec,
                                    const CommConfig& config, std::int64_t first_step,
                                    std::int64_t end_step, const c10::Device& device,
                                    HealthChannel* health);

/// The receiving end `end`, like make_sender. Over MPI a CUDA receiver gets its messages on the
/// device (pinned host ring, then StagingReceiver).
std::unique_ptr<Receiver> make_receiver(const StreamEnd& end, const MessageSpec& spec,
                                        const CommConfig& config, std::int64_t first_step,
                                        std::int64_t end_step, const c10::Device& device,
                                        HealthChannel* health);

/// A pipeline stage's links to its neighbours in the replica (teacher.placement = shard): the
/// previous stage's stream in (null on the first stage), the stream to the next stage out (null
/// on the last). Same ring, checks, deadlines and health polling as the student stream.
struct StageStreams {
  std::unique_ptr<Receiver> from_previous;
  std::unique_ptr<Sender> to_next;
};

/// The stage links of teacher `world_rank` (make_receiver, make_sender). The link from the
/// previous stage is made first: every link's two stages make it in the same order, stage by
/// stage.
StageStreams make_stage_streams(const ProcessGroups& groups, int world_rank,
                                const MessageSpec& from_previous, const MessageSpec& to_next,
                                const CommConfig& config, std::int64_t first_step,
                                std::int64_t end_step, const c10::Device& device,
                                HealthChannel* health);

/// The NCCL sending end (nccl_transport.cpp, compiled only with a CUDA LibTorch and NCCL;
/// elsewhere it throws ConfigError): one NCCL communicator per stream, a ring of
/// prefetch_depth device buffers, sends on a dedicated stream ordered by CUDA events against
/// torch's current stream.
std::unique_ptr<Sender> make_nccl_sender(const StreamEnd& end, const MessageSpec& spec,
                                         const CommConfig& config, std::int64_t first_step,
                                         std::int64_t end_step, const c10::Device& device,
                                         HealthChannel* health);

/// The NCCL receiving end, like make_nccl_sender.
std::unique_ptr<Receiver> make_nccl_receiver(const StreamEnd& end, const MessageSpec& spec,
                                             const CommConfig& config, std::int64_t first_step,
                                             std::int64_t end_step, const c10::Device& device,
                                             HealthChannel* health);

}  // namespace wd::comm
