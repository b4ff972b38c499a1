// Builds without the NCCL transport (a CPU LibTorch, or -DWD_NCCL=OFF): the NCCL factories
// exist so callers link, and say why they cannot work if reached.
#include <string>

#include "comm/backend_choice.hpp"
#include "comm/nccl_gradient_reducer.hpp"
#include "comm/shard_collectives.hpp"
#include "comm/token_head_exchange_factory.hpp"
#include "comm/transport_factory.hpp"
#include "core/errors.hpp"

namespace wd::comm {

namespace {
[[noreturn]] void no_nccl(int world_rank, const char* what, const c10::Device& device) {
  throw ConfigError("rank " + std::to_string(world_rank) + ": " + what + " on " + device.str() +
                    " needs NCCL, and this build has none (a CPU LibTorch, or -DWD_NCCL=OFF); "
                    "use comm.backend auto or mpi, or rebuild against a CUDA LibTorch with NCCL");
}
}  // namespace

bool nccl_built() { return false; }

std::unique_ptr<Sender> make_nccl_sender(const StreamEnd& end, const MessageSpec&, const CommConfig&,
                                         std::int64_t, std::int64_t, const c10::Device& device,
                                         HealthChannel*) {
  no_nccl(end.world_rank, ("the NCCL transport of " + end.name).c_str(), device);
}

std::unique_ptr<Receiver> make_nccl_receiver(const StreamEnd& end, const MessageSpec&, const CommConfig&,
                                             std::int64_t, std::int64_t, const c10::Device& device,
                                             HealthChannel*) {
  no_nccl(end.world_rank, ("the NCCL transport of " + end.name).c_str(), device);
}

std::unique_ptr<GradientReducer> make_nccl_gradient_reducer(MPI_Comm, std::vector<torch::Tensor>,
                                                            std::uint64_t, double, int world_rank,
                                                            const c10::Device& device, HealthChannel*) {
  no_nccl(world_rank, "the NCCL gradient all-reduce", device);
}

std::unique_ptr<TokenHeadExchange> make_nccl_token_head_exchange(MPI_Comm, const c10::Device& device, double,
                                                                 int world_rank, HealthChannel*) {
  no_nccl(world_rank, "the NCCL sequence-parallel all-to-all", device);
}

std::shared_ptr<ShardCollectives> make_nccl_shard_collectives(MPI_Comm, const c10::Device& device, double,
                                                              int world_rank, HealthChannel*) {
  no_nccl(world_rank, "the NCCL reduce-scatter and all-gather of student.shard", device);
}

}  // namespace wd::comm
