// NcclGradientReducer: bucketed fp32 gradient average over NCCL (CUDA LibTorch builds only).
#include "comm/nccl_gradient_reducer.hpp"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "comm/grad_buckets.hpp"
#include "comm/nccl_comm.hpp"
#include "core/host_sync.hpp"

namespace wd::comm {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

struct NcclGradientReducer::Impl {
  Impl(MPI_Comm students, std::vector<torch::Tensor> parameters, std::uint64_t bucket_bytes,
       double timeout_s, int world_rank, const c10::Device& device, HealthChannel* health)
      : params(std::move(parameters)),
        index(device.has_index() ? device.index() : c10::cuda::current_device()),
        timeout(timeout_s),
        rank(world_rank),
        stream(index),
        packed(index),
        done(index) {
    WD_CHECK(students != MPI_COMM_NULL,
             "gradient reduction runs in the student group; rank " << world_rank << " is not in it");
    WD_CHECK_AS(ConfigError, device.is_cuda(),
                "NcclGradientReducer averages CUDA gradients; rank " << world_rank << " has "
                                                                     << device.str());
    for (std::size_t i = 0; i < params.size(); ++i) {
      WD_CHECK(params[i].defined(), "parameter " << i << " given to the gradient reducer is undefined");
      WD_CHECK(params[i].device() == torch::Device(torch::kCUDA, index),
               "parameter " << i << " is on " << params[i].device().str()
                            << "; the NCCL reducer of rank " << world_rank << " works on cuda:"
                            << static_cast<int>(index));
    }
    int students_size = 1;
    MPI_Comm_size(students, &students_size);
    buckets = make_grad_buckets(params, bucket_bytes,
                                torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA, index),
                                students_size, &whole);
    for (GradBucket& bucket : buckets) bind_grads(params, bucket);
    comm.emplace(students, index, timeout_s, health);
    group_size = comm->size();
    for (int r = 0; r < comm->size(); ++r) {
      if (comm->world_rank_of(r) != world_rank) peers.push_back(comm->world_rank_of(r));
    }
  }

  /// `posted` runs once the all-reduce is enqueued, before the wait (the fault hook).
  template <typename Posted>
  void average(std::int64_t step, Posted posted) {
    torch::NoGradGuard no_grad;
    const c10::cuda::CUDAGuard guard(index);
    const cudaStream_t compute = c10::cuda::getCurrentCUDAStream(index).stream();
    std::uint64_t total_bytes = 0;
    for (GradBucket& bucket : buckets) {
      pack_grads(params, bucket);
      total_bytes += static_cast<std::uint64_t>(bucket.flat.numel()) * sizeof(float);
    }
    packed.record(compute);
    packed.block(stream.get());
    auto group = comm->group();
    for (GradBucket& bucket : buckets) {
      comm->all_reduce_sum(bucket.flat.data_ptr<float>(),
                           static_cast<std::size_t>(bucket.flat.numel()), stream.get());
    }
    group.end();
    done.record(stream.get());
    const auto begin = Clock::now();
    try {
      posted();
      note_host_sync("NcclGradientReducer::average");
      comm->wait(done.get(), WaitInfo{"allreduce grads", step, total_bytes, peers}, timeout);
    } catch (...) {
      waited += std::chrono::duration<double>(Clock::now() - begin).count();
      throw;
    }
    waited += std::chrono::duration<double>(Clock::now() - begin).count();
    done.block(compute);
    for (GradBucket& bucket : buckets) unpack_grads(params, bucket, group_size);
  }

  std::vector<torch::Tensor> params;
  c10::DeviceIndex index;
  std::chrono::duration<double> timeout;
  int rank;
  int group_size = 1;
  std::vector<int> peers;
  // Order: the stream, events and buckets outlive the communicator (declared after them), so
  // an abort stops NCCL before its stream and memory go.
  CudaStream stream;
  CudaEvent packed;  ///< on the compute stream, after the buckets are filled
  CudaEvent done;    ///< on the comm stream, after the all-reduce
  std::vector<GradBucket> buckets;
  torch::Tensor whole;  ///< the one buffer the buckets are views of
  std::optional<NcclComm> comm;
  double waited = 0;
};

NcclGradientReducer::NcclGradientReducer(MPI_Comm students, std::vector<torch::Tensor> params,
                                         std::uint64_t bucket_bytes, double timeout_s,
                                         int world_rank, const c10::Device& device,
                                         HealthChannel* health)
    : GradientReducer(health),
      impl_(std::make_unique<Impl>(students, std::move(params), bucket_bytes, timeout_s, world_rank,
                                   device, health)) {}

NcclGradientReducer::~NcclGradientReducer() = default;

void NcclGradientReducer::average(std::int64_t step) {
  impl_->average(step, [&] { fault_point(step); });
}
std::size_t NcclGradientReducer::bucket_count() const { return impl_->buckets.size(); }
torch::Tensor NcclGradientReducer::whole_buffer() const { return impl_->whole; }
double NcclGradientReducer::wait_seconds() const { return impl_->waited; }

std::unique_ptr<GradientReducer> make_nccl_gradient_reducer(MPI_Comm students,
                                                            std::vector<torch::Tensor> params,
                                                            std::uint64_t bucket_bytes,
                                                            double timeout_s, int world_rank,
                                                            const c10::Device& device,
                                                            HealthChannel* health) {
  return std::make_unique<NcclGradientReducer>(students, std::move(params), bucket_bytes,
                                               timeout_s, world_rank, device, health);
}

}  // namespace wd::comm
