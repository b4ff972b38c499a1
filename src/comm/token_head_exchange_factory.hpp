// The sequence-parallel all-to-all of a student group, its backend chosen as the gradient
// all-reduce's is (comm.backend; NCCL where every rank of the group has a GPU of its own).
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <memory>

#include "comm/comm_config.hpp"
#include "core/token_head_exchange.hpp"

namespace wd::comm {

class HealthChannel;

/// An exchange over `group` (not owned: it must outlive the exchange) for tensors on `device`:
/// NCCL (NcclTokenHeadExchange) where `backend` and the group's devices allow it (every rank on
/// a GPU of its own, a build with NCCL), else MPI (MpiTokenHeadExchange). Collective over `group`.
std::unique_ptr<TokenHeadExchange> make_token_head_exchange(MPI_Comm group, const c10::Device& device,
                                                            CommBackend backend, double timeout_s, int world_rank,
                                                            HealthChannel* health);

/// The NCCL exchange (defined where the build has the NCCL transport; elsewhere it throws
/// ConfigError, and make_token_head_exchange never asks for it there). Collective over `group`.
std::unique_ptr<TokenHeadExchange> make_nccl_token_head_exchange(MPI_Comm group, const c10::Device& device,
                                                                 double timeout_s, int world_rank,
                                                                 HealthChannel* health);

}  // namespace wd::comm
