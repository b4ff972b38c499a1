// make_transport: NCCL for CUDA devices where the build has it, MPI otherwise.
#include "comm/transport_factory.hpp"

#include <spdlog/spdlog.h>

#include "core/errors.hpp"

namespace wd::comm {

bool nccl_transport_built() {
#if defined(WD_HAVE_NCCL_TRANSPORT)
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Transport> make_transport(const ProcessGroups& groups, int world_rank,
                                          const MessageSpec& spec, const CommConfig& config,
                                          std::int64_t first_step, std::int64_t end_step,
                                          const c10::Device& device) {
  if (!device.is_cuda()) {
    spdlog::info("transport: MPI ({} tensors stay on the host; {} steps from {}, prefetch {})",
                 device.str(), end_step - first_step, first_step, config.prefetch_depth);
    return make_mpi_transport(groups, world_rank, spec, config, first_step, end_step);
  }
  if (!nccl_transport_built()) {
    throw ConfigError("rank " + std::to_string(world_rank) + " streams tensors on " +
                      device.str() +
                      ", but this build has no CUDA LibTorch/NCCL (NCCL transport not compiled); "
                      "rebuild against a CUDA LibTorch with NCCL, or run the teacher and students "
                      "on the CPU");
  }
  spdlog::info("transport: NCCL ({} tensors; {} steps from {}, prefetch {}, mode {})", device.str(),
               end_step - first_step, first_step, config.prefetch_depth, config.mode);
  return make_nccl_transport(groups, world_rank, spec, config, first_step, end_step, device);
}

#if !defined(WD_HAVE_NCCL_TRANSPORT)
// Defined so the declaration links in every build; make_transport never calls it here.
std::unique_ptr<Transport> make_nccl_transport(const ProcessGroups&, int world_rank,
                                               const MessageSpec&, const CommConfig&, std::int64_t,
                                               std::int64_t, const c10::Device& device) {
  throw ConfigError("rank " + std::to_string(world_rank) + ": NCCL transport for " + device.str() +
                    " requested, but this build has no CUDA LibTorch/NCCL");
}
#endif

}  // namespace wd::comm
