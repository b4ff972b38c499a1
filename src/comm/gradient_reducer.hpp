// GradientReducer: the student group's gradient average, one interface over MPI (host buffers)
// and NCCL (CUDA buffers), chosen once at start-up by make_gradient_reducer.
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/backend_choice.hpp"
#include "comm/grad_buckets.hpp"
#include "comm/stream_mark.hpp"
#include "comm/wait.hpp"

namespace wd::comm {

/// Averages the .grad of a fixed list of parameters over the student group. Each fp32 .grad is a
/// view into a bucket of at most bucket_bytes (all views of one buffer, allocated once: bind_grads),
/// reduced and divided by the group size in place; a grad of another dtype, device or layout is
/// packed and copied back. Equal to one process over the union of the batches. A missing grad
/// counts as zeros (and is created).
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  /// Averages every parameter's .grad; waits with deadline (naming the missing peers).
  virtual void average(std::int64_t step) = 0;
  virtual std::size_t bucket_count() const = 0;
  /// Seconds spent waiting for the reduction so far.
  virtual double wait_seconds() const = 0;
  /// "mpi" or "nccl", for the log.
  virtual const char* backend() const = 0;
  /// The one buffer every bucket (and so every bound .grad) is a view of, padded with zeros to
  /// a multiple of the group size; undefined for a group of one (no buckets).
  virtual torch::Tensor whole_buffer() const { return {}; }
  /// Testing aid: `hook(step)` runs inside every average(step), once this rank's part of the
  /// all-reduce is posted and before it waits, so a fault there strikes while the other
  /// students are inside the collective.
  void set_fault_hook(FaultHook hook) { fault_hook_ = std::move(hook); }

 protected:
  /// `health` (null: none) is what the reducer's waits poll and its fault point marks.
  explicit GradientReducer(HealthChannel* health) : health_(health) {}
  HealthChannel* health() const { return health_; }
  /// Where an implementation calls the fault hook (marks the rank as in "allreduce grads").
  void fault_point(std::int64_t step) const { run_fault_hook(fault_hook_, health_, "allreduce grads", step); }

 private:
  FaultHook fault_hook_;
  HealthChannel* health_;
};

/// Over MPI: one MPI_Iallreduce per bucket. Host gradients are reduced in their buckets. Device
/// buckets are copied to a pinned host twin (one asynchronous copy per bucket, one host wait for
/// all, with deadline), reduced there and copied back (one copy per bucket).
class MpiGradientReducer final : public GradientReducer {
 public:
  MpiGradientReducer(MPI_Comm students, std::vector<torch::Tensor> params,
                     std::uint64_t bucket_bytes, double timeout_s, int world_rank,
                     HealthChannel* health);
  void average(std::int64_t step) override;
  std::size_t bucket_count() const override { return buckets_.size(); }
  double wait_seconds() const override { return wait_seconds_; }
  const char* backend() const override { return "mpi"; }
  torch::Tensor whole_buffer() const override { return whole_; }

 private:
  MPI_Comm comm_;
  std::vector<torch::Tensor> params_;
  std::vector<GradBucket> buckets_;
  torch::Tensor whole_;
  bool staged_ = false;  ///< device parameters: buckets have a pinned host twin
  StreamMark packed_;    ///< after the copies into the host twins
  std::vector<int> peers_;  ///< world ranks of the student group, for timeout messages
  int group_size_ = 1;
  double timeout_s_;
  int world_rank_;
  double wait_seconds_ = 0;
};

/// A group of one student: its gradients already are the group's average, so nothing is
/// copied, sent or waited for (no communicator at all). Missing grads are created as zeros, as
/// the other reducers do; the fault hook runs where an all-reduce would.
class LocalGradientReducer final : public GradientReducer {
 public:
  LocalGradientReducer(std::vector<torch::Tensor> params, HealthChannel* health)
      : GradientReducer(health), params_(std::move(params)) {}
  void average(std::int64_t step) override;
  std::size_t bucket_count() const override { return 0; }
  double wait_seconds() const override { return 0; }
  const char* backend() const override { return "none"; }

 private:
  std::vector<torch::Tensor> params_;
};

/// The reducer for `params` on `device` over `students`: LocalGradientReducer for a group of
/// one (whatever `backend` says: there is nothing to carry); else NCCL when every student's
/// parameters are on a distinct GPU and the build has NCCL (or `backend` says nccl), MPI
/// otherwise. Collective over `students` (the students agree on the choice from the same
/// gathered facts); logs the choice and its reason once per group. Every wait, set-up included,
/// polls `health` (null: none). Throws ConfigError when `backend` asks for NCCL where it
/// cannot work.
std::unique_ptr<GradientReducer> make_gradient_reducer(MPI_Comm students,
                                                       std::vector<torch::Tensor> params,
                                                       std::uint64_t bucket_bytes,
                                                       double timeout_s, int world_rank,
                                                       const c10::Device& device,
                                                       CommBackend backend,
                                                       HealthChannel* health);

}  // namespace wd::comm
