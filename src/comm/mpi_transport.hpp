// The MPI ends of a stream (host tensors): make_mpi_sender and make_mpi_receiver.
#pragma once

#include <cstdint>
#include <memory>

#include "comm/comm_config.hpp"
#include "comm/message_spec.hpp"
#include "comm/receiver.hpp"
#include "comm/sender.hpp"
#include "comm/stream_end.hpp"

namespace wd::comm {

class HealthChannel;

/// The MPI sending end `end` (host tensors) of steps [first_step, end_step). Every wait polls
/// `health` (null: none). `pinned` page-locks the ring buffers (only in a CUDA build: a CUDA
/// device copies into them). Throws wd::Error when `end` is not a sending end.
std::unique_ptr<Sender> make_mpi_sender(const StreamEnd& end, const MessageSpec& spec,
                                        const CommConfig& config, std::int64_t first_step,
                                        std::int64_t end_step, HealthChannel* health,
                                        bool pinned = false);

/// The MPI receiving end `end`, like make_mpi_sender; it cancels its outstanding receives when
/// destroyed early. `pinned`: a CUDA device copies out of the ring buffers.
std::unique_ptr<Receiver> make_mpi_receiver(const StreamEnd& end, const MessageSpec& spec,
                                            const CommConfig& config, std::int64_t first_step,
                                            std::int64_t end_step, HealthChannel* health,
                                            bool pinned = false);

}  // namespace wd::comm
