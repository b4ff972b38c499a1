// NcclTokenHeadExchange: the sequence-parallel all-to-all over NCCL, for a group whose ranks each
// have a GPU of their own. Compiled only with a CUDA LibTorch and NCCL (no_nccl.cpp stands in
// elsewhere). NOT RUN YET: the machines lent to this project have one GPU, and NCCL refuses two
// ranks of one communicator on one GPU; launch/gpu/all.sh runs it where two GPUs are visible.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "comm/mpi_check.hpp"
#include "comm/nccl_comm.hpp"
#include "comm/token_head_exchange_factory.hpp"
#include "core/errors.hpp"
#include "core/host_sync.hpp"
#include "core/logging.hpp"

namespace wd::comm {

namespace {

/// One grouped ncclSend/ncclRecv of N equal chunks (send[j] to rank j, recv[i] from rank i, the
/// rank's own chunk included, which NCCL copies locally) on a stream of its own: it waits, by
/// event, for the compute stream's work on the send buffer, and the compute stream waits for it;
/// the host waits too (deadline, health channel, NCCL's asynchronous errors), so a dead peer
/// cannot leave this rank blocked in a kernel.
class NcclTokenHeadExchange final : public TokenHeadExchange {
 public:
  NcclTokenHeadExchange(MPI_Comm group, std::pair<int, int> rank_size, c10::DeviceIndex index, double timeout_s,
                        int world_rank, HealthChannel* health)
      : TokenHeadExchange(rank_size.first, rank_size.second), index_(index), timeout_(timeout_s),
        stream_(index), sent_(index), done_(index) {
    comm_.emplace(group, index, timeout_s, health);
    for (int r = 0; r < comm_->size(); ++r) {
      if (comm_->world_rank_of(r) != world_rank) peers_.push_back(comm_->world_rank_of(r));
    }
  }

  torch::Tensor all_to_all(const torch::Tensor& send) override {
    const auto n = size();
    WD_CHECK(send.dim() >= 1 && send.size(0) == n,
             "all_to_all takes [N=" << n << ", ...], got " << format_shape(send.sizes()));
    WD_CHECK(send.is_cuda() && send.device().index() == index_,
             "the NCCL sequence-parallel all-to-all works on cuda:" << static_cast<int>(index_) << ", got "
                                                                     << send.device());
    const c10::cuda::CUDAGuard guard(index_);
    const cudaStream_t compute = c10::cuda::getCurrentCUDAStream(index_).stream();
    const auto in = send.contiguous();
    auto out = torch::empty_like(in);
    const auto bytes = static_cast<std::size_t>(in.numel()) * in.element_size();
    const auto chunk = bytes / static_cast<std::size_t>(n);
    sent_.record(compute);
    sent_.block(stream_.get());
    {
      auto group = comm_->group();
      const auto* from = static_cast<const char*>(in.data_ptr());
      auto* to = static_cast<char*>(out.data_ptr());
      for (int peer = 0; peer < n; ++peer) {
        comm_->send(from + static_cast<std::size_t>(peer) * chunk, chunk, peer, stream_.get());
        comm_->recv(to + static_cast<std::size_t>(peer) * chunk, chunk, peer, stream_.get());
      }
      group.end();
    }
    done_.record(stream_.get());
    note_host_sync("NcclTokenHeadExchange::all_to_all");
    comm_->wait(done_.get(), WaitInfo{"sequence-parallel all-to-all", calls_++, bytes, peers_}, timeout_);
    // The host waited for the exchange's stream: `in` may go back to the caching allocator, and
    // `out` is used on the compute stream, which waits for the exchange on the device too.
    done_.block(compute);
    return out;
  }

  const char* backend() const override { return "nccl"; }

 private:
  c10::DeviceIndex index_;
  std::chrono::duration<double> timeout_;
  std::vector<int> peers_;
  std::int64_t calls_ = 0;
  // The stream and events outlive the communicator (declared before it): an abort stops NCCL
  // before its stream goes.
  CudaStream stream_;
  CudaEvent sent_;  ///< on the compute stream, after the send buffer is written
  CudaEvent done_;  ///< on the exchange's stream, after the all-to-all
  std::optional<NcclComm> comm_;
};

}  // namespace

std::unique_ptr<TokenHeadExchange> make_nccl_token_head_exchange(MPI_Comm group, const c10::Device& device,
                                                                 double timeout_s, int world_rank,
                                                                 HealthChannel* health) {
  WD_CHECK(device.is_cuda(), "the NCCL sequence-parallel all-to-all needs a CUDA device, rank " << world_rank
                                                                                               << " has " << device);
  return std::make_unique<NcclTokenHeadExchange>(group, rank_and_size(group, "a sequence-parallel exchange"),
                                                 device.index() < 0 ? 0 : device.index(), timeout_s, world_rank,
                                                 health);
}

}  // namespace wd::comm
