// MpiGradientReducer and the choice between it and NcclGradientReducer.
#include "comm/gradient_reducer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "comm/mpi_check.hpp"
#include "comm/mpi_runtime.hpp"
#include "comm/nccl_gradient_reducer.hpp"
#include "core/config.hpp"
#include "core/errors.hpp"

namespace wd::comm {

namespace {
using Clock = std::chrono::steady_clock;

/// Where the reducer's parameters live (the host when it has none).
c10::Device device_of(const std::vector<torch::Tensor>& params) {
  return params.empty() ? c10::Device(c10::kCPU) : params.front().device();
}

/// The buffer MPI reduces: the pinned twin of a device bucket, else the bucket itself.
torch::Tensor& mpi_buffer(GradBucket& bucket) {
  return bucket.host.defined() ? bucket.host : bucket.flat;
}
}  // namespace

MpiGradientReducer::MpiGradientReducer(MPI_Comm students, std::vector<torch::Tensor> params,
                                       std::uint64_t bucket_bytes, double timeout_s,
                                       int world_rank, HealthChannel* health)
    : GradientReducer(health),
      comm_(students),
      params_(std::move(params)),
      staged_(!device_of(params_).is_cpu()),
      packed_(device_of(params_)),
      timeout_s_(timeout_s),
      world_rank_(world_rank) {
  WD_CHECK(comm_ != MPI_COMM_NULL,
           "gradient reduction runs in the student group; rank " << world_rank << " is not in it");
  WD_CHECK_MPI(MPI_Comm_size(comm_, &group_size_));
  peers_ = world_ranks_of(comm_);
  // A timeout names the others: this rank is evidently still here.
  peers_.erase(std::remove(peers_.begin(), peers_.end(), world_rank), peers_.end());

  buckets_ = make_grad_buckets(params_, bucket_bytes,
                               torch::TensorOptions().dtype(torch::kFloat).device(device_of(params_)),
                               group_size_, &whole_);
  for (auto& bucket : buckets_) {
    bind_grads(params_, bucket);
    // Pinned, so the copies each way are asynchronous DMA transfers.
    if (staged_) {
      bucket.host = torch::empty({bucket.flat.numel()},
                                 torch::TensorOptions().dtype(torch::kFloat).pinned_memory(true));
    }
    WD_CHECK(bucket.flat.numel() <= std::numeric_limits<int>::max(),
             "a gradient bucket of " << bucket.flat.numel()
                                     << " elements exceeds MPI's int count; lower comm.bucket_mb");
  }
}

void MpiGradientReducer::average(std::int64_t step) {
  torch::NoGradGuard no_grad;
  std::vector<MPI_Request> requests(buckets_.size(), MPI_REQUEST_NULL);
  std::uint64_t total_bytes = 0;
  for (const GradBucket& bucket : buckets_) {
    total_bytes += static_cast<std::uint64_t>(bucket.flat.numel()) * sizeof(float);
  }
  if (staged_) {
    // Device gradients: packed by kernels on the device, one asynchronous copy per bucket to
    // its pinned twin, and one host wait for them all (not one per parameter).
    for (GradBucket& bucket : buckets_) {
      pack_grads(params_, bucket);
      bucket.host.copy_(bucket.flat, /*non_blocking=*/true);
    }
    packed_.record();
    packed_.wait(WaitInfo{"allreduce grads: device to host", step, total_bytes, {}},
                 std::chrono::duration<double>(timeout_s_), world_rank_, health(),
                 "MpiGradientReducer::average");
  }
  // Host gradients: each bucket's all-reduce starts as soon as it is packed, overlapping the
  // next bucket's copy.
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    GradBucket& bucket = buckets_[b];
    if (!staged_) pack_grads(params_, bucket);
    torch::Tensor& buffer = mpi_buffer(bucket);
    WD_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, buffer.data_ptr<float>(),
                                static_cast<int>(buffer.numel()), MPI_FLOAT, MPI_SUM, comm_,
                                &requests[b]));
  }
  const auto start = Clock::now();
  try {
    fault_point(step);
    wait_all_with_deadline(requests, WaitInfo{"allreduce grads", step, total_bytes, peers_},
                           std::chrono::duration<double>(timeout_s_), world_rank_, health());
  } catch (...) {
    wait_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
    // The all-reduce is abandoned, not finished: MPI may still write into the buckets.
    for (GradBucket& bucket : buckets_) keep_until_exit(mpi_buffer(bucket));
    throw;
  }
  wait_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();

  for (GradBucket& bucket : buckets_) {
    // Ordered on the stream before the unpacking kernels; the host need not wait. The pinned
    // twin is next written by the next average's copy, queued behind this one.
    if (staged_) bucket.flat.copy_(bucket.host, /*non_blocking=*/true);
    unpack_grads(params_, bucket, group_size_);
  }
}

void LocalGradientReducer::average(std::int64_t step) {
  fault_point(step);
  torch::NoGradGuard no_grad;
  for (torch::Tensor& p : params_) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
  }
}

std::unique_ptr<GradientReducer> make_gradient_reducer(MPI_Comm students,
                                                       std::vector<torch::Tensor> params,
                                                       std::uint64_t bucket_bytes,
                                                       double timeout_s, int world_rank,
                                                       const c10::Device& device,
                                                       CommBackend backend,
                                                       HealthChannel* health) {
  WD_CHECK(students != MPI_COMM_NULL,
           "gradient reduction runs in the student group; rank " << world_rank << " is not in it");
  int size = 0;
  WD_CHECK_MPI(MPI_Comm_size(students, &size));
  if (size == 1) {
    spdlog::info("gradient all-reduce: none (a group of one student: its gradients are the average; "
                 "comm.backend {} has nothing to carry)",
                 name_of(backend));
    return std::make_unique<LocalGradientReducer>(std::move(params), health);
  }
  const auto ends = gather_devices(students, world_rank, device, timeout_s, "gradient all-reduce", health);
  const auto choice = choose_backend(backend, ends, nccl_built(), "the gradient all-reduce");
  if (ends.front().world_rank == world_rank) {
    spdlog::info("gradient all-reduce: {} over {} student(s) ({})", backend_name(choice.backend),
                 ends.size(), choice.reason);
  }
  if (choice.backend == Backend::kNccl) {
    return make_nccl_gradient_reducer(students, std::move(params), bucket_bytes, timeout_s,
                                      world_rank, device, health);
  }
  return std::make_unique<MpiGradientReducer>(students, std::move(params), bucket_bytes, timeout_s,
                                              world_rank, health);
}

}  // namespace wd::comm
