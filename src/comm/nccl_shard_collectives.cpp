// NcclShardCollectives: ZeRO's reduce-scatter and all-gather over NCCL, on the GPUs' own memory,
// for a student group whose ranks each have a GPU of their own. Compiled only with a CUDA
// LibTorch and NCCL (no_nccl.cpp stands in elsewhere). NOT RUN YET: the machines lent to this
// project have one GPU, and NCCL refuses two ranks of one communicator on one GPU;
// launch/gpu/all.sh's step shard_gradients_nccl runs it where two GPUs are visible.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "comm/mpi_check.hpp"
#include "comm/nccl_comm.hpp"
#include "comm/shard_collectives.hpp"
#include "core/errors.hpp"

namespace wd::comm {

namespace {

/// Done when the collective's event has completed on the collectives' stream.
class NcclPending final : public ShardCollectives::Pending {
 public:
  explicit NcclPending(int device) : event(device) {}
  bool done() override {
    const cudaError_t rc = cudaEventQuery(event.get());
    if (rc == cudaErrorNotReady) return false;
    WD_CHECK_CUDA(rc);
    return true;
  }
  CudaEvent event;
};

void check_device_floats(const torch::Tensor& t, c10::DeviceIndex index, const char* what) {
  WD_CHECK(t.is_cuda() && t.device().index() == index && t.scalar_type() == torch::kFloat && t.is_contiguous(),
           "the NCCL " << what << " takes contiguous fp32 buffers on cuda:" << static_cast<int>(index) << "; got "
                       << t.scalar_type() << " on " << t.device());
}

/// Each collective runs on a stream of its own: it waits, by event, for the work the calling
/// thread's current stream queued on the send buffer (a gradient hook's packing runs on the
/// autograd engine's stream), and records an event the host polls. The caller touches `recv`
/// only after the host saw that event (done() or wait_all), so no stream needs to wait for it.
/// Every wait polls with the deadline, the health channel and NCCL's asynchronous errors, and a
/// failure aborts the communicator (NcclComm), so a dead peer cannot leave a rank in a kernel.
class NcclShardCollectives final : public ShardCollectives {
 public:
  NcclShardCollectives(MPI_Comm students, c10::DeviceIndex index, double timeout_s, HealthChannel* health)
      : index_(index), stream_(index), ready_(index) {
    comm_.emplace(students, index, timeout_s, health);
  }

  c10::Device buffer_device() const override { return c10::Device(torch::kCUDA, index_); }
  bool posts_from_any_thread() const override { return true; }

  std::unique_ptr<Pending> reduce_scatter(const torch::Tensor& send, const torch::Tensor& recv,
                                          const std::vector<int>& counts) override {
    check_device_floats(send, index_, "reduce-scatter");
    check_device_floats(recv, index_, "reduce-scatter");
    return enqueue([&](cudaStream_t stream) {
      const auto* from = send.data_ptr<float>();
      auto* to = recv.data_ptr<float>();
      if (std::all_of(counts.begin(), counts.end(), [&](int c) { return c == counts.front(); })) {
        comm_->reduce_scatter_sum(from, to, static_cast<std::size_t>(counts.front()), stream);
        return;
      }
      // Uneven parts (a bucket crossing slices): one reduce to each part's owner, fused in a group.
      auto group = comm_->group();
      std::size_t at = 0;
      for (int root = 0; root < comm_->size(); ++root) {
        const auto n = static_cast<std::size_t>(counts[static_cast<std::size_t>(root)]);
        if (n > 0) comm_->reduce_sum(from + at, to, n, root, stream);
        at += n;
      }
      group.end();
    });
  }

  std::unique_ptr<Pending> all_gather(const torch::Tensor& send, const torch::Tensor& recv,
                                      const std::vector<int>& counts, const std::vector<int>& displs) override {
    check_device_floats(send, index_, "all-gather");
    check_device_floats(recv, index_, "all-gather");
    return enqueue([&](cudaStream_t stream) {
      const auto* from = send.data_ptr<float>();
      auto* to = recv.data_ptr<float>();
      bool even = true;
      for (std::size_t r = 0; r < counts.size(); ++r) {
        even = even && counts[r] == counts.front() && displs[r] == static_cast<int>(r) * counts.front();
      }
      if (even) {
        comm_->all_gather(from, to, static_cast<std::size_t>(counts.front()), stream);
        return;
      }
      // Uneven parts: each rank broadcasts its own, fused in a group (the root's may be in place).
      auto group = comm_->group();
      for (int root = 0; root < comm_->size(); ++root) {
        const auto r = static_cast<std::size_t>(root);
        if (counts[r] == 0) continue;
        auto* part = to + displs[r];
        comm_->broadcast(root == comm_->rank() ? static_cast<const void*>(from) : part, part,
                         static_cast<std::size_t>(counts[r]) * sizeof(float), root, stream);
      }
      group.end();
    });
  }

  void wait_all(const std::vector<Pending*>& pending, const WaitInfo& info,
                std::chrono::duration<double> timeout) override {
    const auto start = std::chrono::steady_clock::now();
    for (auto* p : pending) {
      const std::chrono::duration<double> left = timeout - (std::chrono::steady_clock::now() - start);
      comm_->wait(static_cast<NcclPending*>(p)->event.get(), info,
                  std::max(left, std::chrono::duration<double>(0)));
    }
  }

  const char* backend() const override { return "nccl"; }

 private:
  template <typename Enqueue>
  std::unique_ptr<Pending> enqueue(Enqueue&& calls) {
    const c10::cuda::CUDAGuard guard(index_);
    const cudaStream_t caller = c10::cuda::getCurrentCUDAStream(index_).stream();
    ready_.record(caller);
    ready_.block(stream_.get());
    calls(stream_.get());
    auto pending = std::make_unique<NcclPending>(index_);
    pending->event.record(stream_.get());
    return pending;
  }

  c10::DeviceIndex index_;
  // The stream and events outlive the communicator (declared before it): an abort stops NCCL
  // before its stream goes.
  CudaStream stream_;
  CudaEvent ready_;  ///< on the caller's stream, after the send buffer is written
  std::optional<NcclComm> comm_;
};

}  // namespace

std::shared_ptr<ShardCollectives> make_nccl_shard_collectives(MPI_Comm students, const c10::Device& device,
                                                              double timeout_s, int world_rank,
                                                              HealthChannel* health) {
  WD_CHECK(device.is_cuda(), "the NCCL reduce-scatter and all-gather of student.shard need a CUDA device, rank "
                                 << world_rank << " has " << device);
  rank_and_size(students, "student.shard's collectives");
  return std::make_shared<NcclShardCollectives>(students, device.index() < 0 ? 0 : device.index(), timeout_s,
                                                health);
}

}  // namespace wd::comm
