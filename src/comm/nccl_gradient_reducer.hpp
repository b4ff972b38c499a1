// NcclGradientReducer: the student group's gradient average over NCCL, for CUDA parameters.
// The header is NCCL-free (the communicator hides behind a pointer); the implementation is
// compiled only with a CUDA LibTorch and NCCL (no_nccl.cpp stands in elsewhere).
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/gradient_reducer.hpp"

namespace wd::comm {

/// Same semantics as MpiGradientReducer: gradients are packed into fp32 buckets of
/// at most bucket_bytes, allocated once on the parameters' device; one ncclAllReduce per bucket
/// (all in one NCCL group) on a dedicated stream that waits, by event, for the packing on
/// torch's current stream; a host wait with deadline (polling the health channel and NCCL's
/// asynchronous error); then the average is copied back into .grad (a missing grad counts as
/// zeros and is created). Collective over `students` when made.
class NcclGradientReducer final : public GradientReducer {
 public:
  NcclGradientReducer(MPI_Comm students, std::vector<torch::Tensor> params,
                      std::uint64_t bucket_bytes, double timeout_s, int world_rank,
                      const c10::Device& device, HealthChannel* health);
  ~NcclGradientReducer() override;
  NcclGradientReducer(const NcclGradientReducer&) = delete;
  NcclGradientReducer& operator=(const NcclGradientReducer&) = delete;

  /// Averages the .grad of every parameter over the student group.
  void average(std::int64_t step) override;
  std::size_t bucket_count() const override;
  torch::Tensor whole_buffer() const override;
  double wait_seconds() const override;
  const char* backend() const override { return "nccl"; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A NcclGradientReducer (defined where the build has the NCCL transport; elsewhere it throws
/// ConfigError, and make_gradient_reducer never asks for it there).
std::unique_ptr<GradientReducer> make_nccl_gradient_reducer(MPI_Comm students,
                                                            std::vector<torch::Tensor> params,
                                                            std::uint64_t bucket_bytes,
                                                            double timeout_s, int world_rank,
                                                            const c10::Device& device,
                                                            HealthChannel* health);

}  // namespace wd::comm
