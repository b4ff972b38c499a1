// make_transport: the backend choice for a link, and the transport that carries it.
#include "comm/transport_factory.hpp"

#include <spdlog/spdlog.h>

#include "comm/staging_transport.hpp"
#include "core/errors.hpp"

namespace wd::comm {

std::unique_ptr<Transport> make_transport(const ProcessGroups& groups, int world_rank,
                                          const MessageSpec& spec, const CommConfig& config,
                                          std::int64_t first_step, std::int64_t end_step,
                                          const c10::Device& device) {
  WD_CHECK(groups.link() != MPI_COMM_NULL,
           "rank " << world_rank
                   << " has no link to students: only a replica's last teacher stage and the "
                      "students stream batches");
  const auto ends = gather_devices(groups.link(), world_rank, device, config.timeout_s,
                                   "exchange transport devices");
  const std::string link = "the teacher -> student link of " + ends.front().describe();
  const auto choice = choose_backend(config.backend, ends, nccl_built(), link);
  const bool sender = ends.front().world_rank == world_rank;  // link rank 0 is the teacher
  if (sender) {
    spdlog::info("transport: {} for {} student(s) ({}; {} steps from {}, prefetch {}, mode {})",
                 backend_name(choice.backend), ends.size() - 1, choice.reason,
                 end_step - first_step, first_step, config.prefetch_depth, config.mode);
  }
  if (choice.backend == Backend::kNccl) {
    return make_nccl_transport(groups, world_rank, spec, config, first_step, end_step, device);
  }
  auto host = make_mpi_transport(groups, world_rank, spec, config, first_step, end_step,
                                 /*pinned=*/device.is_cuda());
  if (sender || !device.is_cuda()) return host;
  return std::make_unique<StagingTransport>(
      std::move(host), spec, device, ring_slots(config.prefetch_depth, first_step, end_step),
      first_step);
}

}  // namespace wd::comm
