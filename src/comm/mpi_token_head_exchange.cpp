// MpiTokenHeadExchange: MPI_Ialltoall with a deadline.
#include "comm/mpi_token_head_exchange.hpp"

#include <algorithm>
#include <chrono>
#include <limits>

#include "comm/mpi_check.hpp"
#include "comm/mpi_runtime.hpp"
#include "core/errors.hpp"
#include "core/logging.hpp"

namespace wd::comm {

MpiTokenHeadExchange::MpiTokenHeadExchange(MPI_Comm group, double timeout_s, HealthChannel* health)
    : MpiTokenHeadExchange(group, rank_and_size(group, "a sequence-parallel exchange"), timeout_s, health) {}

MpiTokenHeadExchange::MpiTokenHeadExchange(MPI_Comm group, std::pair<int, int> rank_size, double timeout_s,
                                           HealthChannel* health)
    : TokenHeadExchange(rank_size.first, rank_size.second), comm_(group), timeout_s_(timeout_s), health_(health) {
  WD_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_));
  peers_ = world_ranks_of(comm_);
  peers_.erase(std::remove(peers_.begin(), peers_.end(), world_rank_), peers_.end());
}

torch::Tensor MpiTokenHeadExchange::all_to_all(const torch::Tensor& send) {
  const auto n = size();
  WD_CHECK(send.dim() >= 1 && send.size(0) == n,
           "all_to_all takes [N=" << n << ", ...], got " << format_shape(send.sizes()));
  // MPI reads host memory: a device tensor is staged (ranks sharing a GPU; NCCL is for distinct ones).
  const auto host = send.to(torch::kCPU).contiguous();
  auto recv = torch::empty_like(host);
  const auto bytes = static_cast<std::uint64_t>(host.numel()) * host.element_size();
  const auto chunk = bytes / static_cast<std::uint64_t>(n);
  WD_CHECK(chunk <= static_cast<std::uint64_t>(std::numeric_limits<int>::max()),
           "a sequence-parallel all-to-all chunk of " << chunk << " bytes exceeds MPI's int count");
  MPI_Request request = MPI_REQUEST_NULL;
  WD_CHECK_MPI(MPI_Ialltoall(host.data_ptr(), static_cast<int>(chunk), MPI_BYTE, recv.data_ptr(),
                             static_cast<int>(chunk), MPI_BYTE, comm_, &request));
  try {
    wait_with_deadline(request, WaitInfo{"sequence-parallel all-to-all", calls_++, bytes, peers_},
                       std::chrono::duration<double>(timeout_s_), world_rank_, health_);
  } catch (...) {
    // Abandoned, not finished: MPI may still read and write both buffers.
    keep_until_exit(host);
    keep_until_exit(recv);
    throw;
  }
  return recv.to(send.device());
}

}  // namespace wd::comm
