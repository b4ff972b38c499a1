// make_sender / make_receiver: the backend choice for one stream, and the end that carries it.
#include "comm/transport_factory.hpp"

#include <spdlog/spdlog.h>

#include "comm/mpi_transport.hpp"
#include "comm/ring.hpp"
#include "comm/staging_receiver.hpp"
#include "core/errors.hpp"

namespace wd::comm {

namespace {

/// The backend of `end`'s stream, agreed by every rank of `end.comm` (collective).
Backend agree_backend(const StreamEnd& end, const CommConfig& config, std::int64_t first_step,
                      std::int64_t end_step, const c10::Device& device, HealthChannel* health) {
  WD_CHECK(end.comm != MPI_COMM_NULL, "rank " << end.world_rank << " is not on " << end.name);
  const auto ends = gather_devices(end.comm, end.world_rank, device, config.timeout_s,
                                   "exchange transport devices", health);
  const auto choice = choose_backend(config.backend, ends, nccl_built(), end.name);
  if (end.sending) {
    spdlog::info("transport: {} on {} to {} {}(s) ({}; {} steps from {}, prefetch {}, mode {})",
                 backend_name(choice.backend), end.name, end.peers.size(), end.receiver,
                 choice.reason, end_step - first_step, first_step, config.prefetch_depth,
                 end.broadcast ? "broadcast" : "scatter");
  }
  return choice.backend;
}

}  // namespace

std::unique_ptr<Sender> make_sender(const StreamEnd& end, const MessageSpec& spec,
                                    const CommConfig& config, std::int64_t first_step,
                                    std::int64_t end_step, const c10::Device& device,
                                    HealthChannel* health) {
  check_end(end, /*sending=*/true);
  if (agree_backend(end, config, first_step, end_step, device, health) == Backend::kNccl)
    return make_nccl_sender(end, spec, config, first_step, end_step, device, health);
  return make_mpi_sender(end, spec, config, first_step, end_step, health, /*pinned=*/device.is_cuda());
}

std::unique_ptr<Receiver> make_receiver(const StreamEnd& end, const MessageSpec& spec,
                                        const CommConfig& config, std::int64_t first_step,
                                        std::int64_t end_step, const c10::Device& device,
                                        HealthChannel* health) {
  check_end(end, /*sending=*/false);
  if (agree_backend(end, config, first_step, end_step, device, health) == Backend::kNccl)
    return make_nccl_receiver(end, spec, config, first_step, end_step, device, health);
  auto host = make_mpi_receiver(end, spec, config, first_step, end_step, health, /*pinned=*/device.is_cuda());
  if (!device.is_cuda()) return host;
  return std::make_unique<StagingReceiver>(
      std::move(host), spec, device, ring_slots(config.prefetch_depth, first_step, end_step),
      first_step, config.timeout_s, end.world_rank, health);
}

StageStreams make_stage_streams(const ProcessGroups& groups, int world_rank,
                                const MessageSpec& from_previous, const MessageSpec& to_next,
                                const CommConfig& config, std::int64_t first_step,
                                std::int64_t end_step, const c10::Device& device,
                                HealthChannel* health) {
  const auto ends = stage_ends(groups, world_rank);
  StageStreams out;
  // Link k joins stages k and k+1 and both make it after link k-1: no stage waits in a link
  // whose other stage is still making an earlier one.
  if (ends.in.comm != MPI_COMM_NULL)
    out.from_previous = make_receiver(ends.in, from_previous, config, first_step, end_step, device, health);
  if (ends.out.comm != MPI_COMM_NULL)
    out.to_next = make_sender(ends.out, to_next, config, first_step, end_step, device, health);
  return out;
}

}  // namespace wd::comm
