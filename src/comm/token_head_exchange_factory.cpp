// make_token_head_exchange: the backend of a sequence-parallel group's all-to-all.
#include "comm/token_head_exchange_factory.hpp"

#include <spdlog/spdlog.h>

#include "comm/backend_choice.hpp"
#include "comm/mpi_token_head_exchange.hpp"

namespace wd::comm {

std::unique_ptr<TokenHeadExchange> make_token_head_exchange(MPI_Comm group, const c10::Device& device,
                                                            CommBackend backend, double timeout_s, int world_rank,
                                                            HealthChannel* health) {
  const auto ends = gather_devices(group, world_rank, device, timeout_s, "sequence-parallel all-to-all", health);
  const auto choice = choose_backend(backend, ends, nccl_built(), "the sequence-parallel all-to-all");
  if (ends.front().world_rank == world_rank) {
    spdlog::info("sequence-parallel all-to-all: {} over {} rank(s) ({})", backend_name(choice.backend), ends.size(),
                 choice.reason);
  }
  if (choice.backend == Backend::kNccl) {
    return make_nccl_token_head_exchange(group, device, timeout_s, world_rank, health);
  }
  return std::make_unique<MpiTokenHeadExchange>(group, timeout_s, health);
}

}  // namespace wd::comm
