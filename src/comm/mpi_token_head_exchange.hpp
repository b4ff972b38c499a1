// MpiTokenHeadExchange: the sequence-parallel all-to-all (core/token_head_exchange.hpp) over MPI.
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "core/token_head_exchange.hpp"

namespace wd::comm {

class HealthChannel;

/// The all-to-all of a sequence-parallel group over MPI: one MPI_Ialltoall of equal byte
/// chunks, waited for with a deadline (naming the call's sequence number, bytes and the group's
/// other ranks) while polling the health channel. Device tensors travel through host copies
/// (the ranks may share one GPU); NCCL, for groups on distinct GPUs, is not built yet.
class MpiTokenHeadExchange final : public TokenHeadExchange {
 public:
  /// Over `group` (not owned: it must outlive this), every wait `timeout_s`; `health` (null:
  /// none) is polled while waiting.
  MpiTokenHeadExchange(MPI_Comm group, double timeout_s, HealthChannel* health = nullptr);
  torch::Tensor all_to_all(const torch::Tensor& send) override;
  const char* backend() const override { return "mpi"; }

 private:
  MpiTokenHeadExchange(MPI_Comm group, std::pair<int, int> rank_size, double timeout_s, HealthChannel* health);

  MPI_Comm comm_;
  double timeout_s_;
  HealthChannel* health_;
  int world_rank_ = 0;
  std::vector<int> peers_;  ///< world ranks of the group's other members, for timeout messages
  std::int64_t calls_ = 0;  ///< sequence number of the next all-to-all
};

}  // namespace wd::comm
