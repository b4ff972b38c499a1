// make_stream: the backend choice for one stream, and the transport that carries it.
#include "comm/transport_factory.hpp"

#include <spdlog/spdlog.h>

#include "comm/staging_transport.hpp"
#include "core/errors.hpp"

namespace wd::comm {

std::unique_ptr<Transport> make_stream(const StreamEnd& end, const MessageSpec& spec,
                                       const CommConfig& config, std::int64_t first_step,
                                       std::int64_t end_step, const c10::Device& device) {
  WD_CHECK(end.comm != MPI_COMM_NULL, "rank " << end.world_rank << " is not on " << end.name);
  const auto ends = gather_devices(end.comm, end.world_rank, device, config.timeout_s,
                                   "exchange transport devices");
  const auto choice = choose_backend(config.backend, ends, nccl_built(), end.name);
  if (end.sending) {
    spdlog::info("transport: {} on {} to {} {}(s) ({}; {} steps from {}, prefetch {}, mode {})",
                 backend_name(choice.backend), end.name, end.peers.size(), end.receiver,
                 choice.reason, end_step - first_step, first_step, config.prefetch_depth,
                 end.broadcast ? "broadcast" : "scatter");
  }
  if (choice.backend == Backend::kNccl) {
    return make_nccl_stream(end, spec, config, first_step, end_step, device);
  }
  auto host = make_mpi_stream(end, spec, config, first_step, end_step, /*pinned=*/device.is_cuda());
  if (end.sending || !device.is_cuda()) return host;
  return std::make_unique<StagingTransport>(
      std::move(host), spec, device, ring_slots(config.prefetch_depth, first_step, end_step),
      first_step, config.timeout_s, end.world_rank);
}

std::unique_ptr<Transport> make_transport(const ProcessGroups& groups, int world_rank,
                                          const MessageSpec& spec, const CommConfig& config,
                                          std::int64_t first_step, std::int64_t end_step,
                                          const c10::Device& device) {
  return make_stream(link_end(groups, world_rank, config), spec, config, first_step, end_step, device);
}

StageTransports make_stage_transports(const ProcessGroups& groups, int world_rank,
                                      const MessageSpec& from_previous, const MessageSpec& to_next,
                                      const CommConfig& config, std::int64_t first_step,
                                      std::int64_t end_step, const c10::Device& device) {
  const auto ends = stage_ends(groups, world_rank);
  StageTransports out;
  // Link k joins stages k and k+1 and both make it after link k-1: no stage waits in a link
  // whose other stage is still making an earlier one.
  if (ends.in.comm != MPI_COMM_NULL)
    out.from_previous = make_stream(ends.in, from_previous, config, first_step, end_step, device);
  if (ends.out.comm != MPI_COMM_NULL)
    out.to_next = make_stream(ends.out, to_next, config, first_step, end_step, device);
  return out;
}

}  // namespace wd::comm
