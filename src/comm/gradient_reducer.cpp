// MpiGradientReducer and the choice between it and NcclGradientReducer.
#include "comm/gradient_reducer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "comm/mpi_check.hpp"
#include "comm/mpi_runtime.hpp"
#include "comm/nccl_gradient_reducer.hpp"
#include "core/errors.hpp"

namespace wd::comm {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

MpiGradientReducer::MpiGradientReducer(MPI_Comm students, std::vector<torch::Tensor> params,
                                       std::uint64_t bucket_bytes, double timeout_s,
                                       int world_rank)
    : comm_(students), params_(std::move(params)), timeout_s_(timeout_s), world_rank_(world_rank) {
  WD_CHECK(comm_ != MPI_COMM_NULL,
           "gradient reduction runs in the student group; rank " << world_rank << " is not in it");
  WD_CHECK_MPI(MPI_Comm_size(comm_, &group_size_));
  peers_ = world_ranks_of(comm_);
  // A timeout names the others: this rank is evidently still here.
  peers_.erase(std::remove(peers_.begin(), peers_.end(), world_rank), peers_.end());

  const bool on_cuda = !params_.empty() && params_.front().is_cuda();
  buckets_ = make_grad_buckets(params_, bucket_bytes,
                               torch::TensorOptions().dtype(torch::kFloat).pinned_memory(on_cuda));
  for (const auto& bucket : buckets_) {
    WD_CHECK(bucket.flat.numel() <= std::numeric_limits<int>::max(),
             "a gradient bucket of " << bucket.flat.numel()
                                     << " elements exceeds MPI's int count; lower comm.bucket_mb");
  }
}

void MpiGradientReducer::average(std::int64_t step) {
  torch::NoGradGuard no_grad;
  std::vector<MPI_Request> requests(buckets_.size(), MPI_REQUEST_NULL);
  std::uint64_t total_bytes = 0;
  // Each bucket's all-reduce starts as soon as it is packed, overlapping the next bucket's copy.
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    GradBucket& bucket = buckets_[b];
    pack_grads(params_, bucket);
    total_bytes += static_cast<std::uint64_t>(bucket.flat.numel()) * sizeof(float);
    WD_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, bucket.flat.data_ptr<float>(),
                                static_cast<int>(bucket.flat.numel()), MPI_FLOAT, MPI_SUM, comm_,
                                &requests[b]));
  }
  const auto start = Clock::now();
  try {
    fault_point(step);
    wait_all_with_deadline(requests, WaitInfo{"allreduce grads", step, total_bytes, peers_},
                           std::chrono::duration<double>(timeout_s_), world_rank_);
  } catch (...) {
    wait_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
    // The all-reduce is abandoned, not finished: MPI may still write into the buckets.
    for (const GradBucket& bucket : buckets_) keep_until_exit(bucket.flat);
    throw;
  }
  wait_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();

  for (GradBucket& bucket : buckets_) unpack_grads(params_, bucket, group_size_);
}

std::unique_ptr<GradientReducer> make_gradient_reducer(MPI_Comm students,
                                                       std::vector<torch::Tensor> params,
                                                       std::uint64_t bucket_bytes,
                                                       double timeout_s, int world_rank,
                                                       const c10::Device& device,
                                                       const std::string& backend) {
  const auto ends = gather_devices(students, world_rank, device, timeout_s, "gradient all-reduce");
  const auto choice = choose_backend(backend, ends, nccl_built(), "the gradient all-reduce");
  if (ends.front().world_rank == world_rank) {
    spdlog::info("gradient all-reduce: {} over {} student(s) ({})", backend_name(choice.backend),
                 ends.size(), choice.reason);
  }
  if (choice.backend == Backend::kNccl) {
    return make_nccl_gradient_reducer(students, std::move(params), bucket_bytes, timeout_s,
                                      world_rank, device);
  }
  return std::make_unique<MpiGradientReducer>(students, std::move(params), bucket_bytes, timeout_s,
                                              world_rank);
}

}  // namespace wd::comm
