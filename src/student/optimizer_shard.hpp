// OptimizerShard (`student.shard optimizer`, ZeRO-1; `gradients`, ZeRO-2): each student rank keeps
// AdamW moments (and with `gradients` the averaged gradients) for one contiguous 1/N slice of the
// trainable parameters and updates only that slice; the updated slices are then all-gathered so
// every rank holds the whole model again.
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include "core/choices.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/gradient_reducer.hpp"
#include "comm/health_channel.hpp"
#include "comm/shard_collectives.hpp"
#include "comm/wait.hpp"
#include "memory/memory_report.hpp"
#include "student/gradient_scatter.hpp"
#include "student/parameter_gather.hpp"

namespace wd::student {

/// One student rank's part of the AdamW moments, as a checkpoint keeps it: elements
/// [begin, begin + size) of the flat layout (the parameters in order, padded to `padded`).
struct MomentSlice {
  int index = 0, count = 1;  ///< group rank and group size
  std::int64_t begin = 0, size = 0, padded = 0;
  std::int64_t steps = 0;                 ///< the group's AdamW step count (0: none yet)
  torch::Tensor exp_avg, exp_avg_sq;      ///< [size] fp32 on the host (zeros without state)
};

/// `student.shard`: what the student group splits between its ranks (core/choices.hpp).
using wd::ShardMode;

/// The parameters are laid out in their order as one flat fp32 vector of `total` elements (the
/// gradient reducer's buffer: bucket after bucket), padded to a multiple of the group size N;
/// group rank r owns elements [r·S, (r+1)·S), S = padded / N. Its slice crosses parameters:
/// each piece is a Segment, and the optimizer steps one view per segment (a view of the
/// parameter, its .grad a view of the parameter's bound .grad), so LibTorch's AdamW does the
/// arithmetic of the unsharded optimizer on these elements.
class OptimizerShard {
 public:
  struct Segment {
    std::size_t param;     ///< index into the parameters
    std::int64_t offset;   ///< first element within the flattened parameter
    std::int64_t length;   ///< elements
    std::int64_t global;   ///< first element within the flat layout
  };

  /// `params` are the trainable tensors, their grads already bound to `whole` (the reducer's
  /// buffer, padded to a multiple of the group size). `collectives`: the all-gather's backend
  /// (null: MPI over `students`, through pinned host memory for device parameters). Not
  /// collective.
  OptimizerShard(MPI_Comm students, std::vector<torch::Tensor> params, torch::Tensor whole, double timeout_s,
                 int world_rank, comm::HealthChannel* health,
                 std::shared_ptr<comm::ShardCollectives> collectives = nullptr);
  /// student.shard gradients: no reducer buffer; the shard owns this rank's gradient slice, which
  /// its GradientScatter (buckets of `bucket_bytes`) fills. `params`: contiguous fp32 on one
  /// device; `sources`: where the backward puts their gradients (StudentParts::grad_sources;
  /// empty: the parameters); `collectives`: the reduce-scatter's and all-gather's backend (null:
  /// MPI). Not collective.
  OptimizerShard(MPI_Comm students, std::vector<torch::Tensor> params, std::uint64_t bucket_bytes, double timeout_s,
                 int world_rank, comm::HealthChannel* health, std::vector<torch::Tensor> sources = {},
                 std::shared_ptr<comm::ShardCollectives> collectives = nullptr);
  /// student.shard parameters: as gradients, and the shard owns this rank's slice of the master
  /// weights too; `blocks[i]` are the indices of DiT block i's parameters, which its
  /// ParameterGather (gate()) lets go of at once and gathers for each use (host parameters, fp32).
  /// Not collective.
  OptimizerShard(MPI_Comm students, std::vector<torch::Tensor> params, std::uint64_t bucket_bytes, double timeout_s,
                 int world_rank, comm::HealthChannel* health, const std::vector<std::vector<std::size_t>>& blocks);
  ~OptimizerShard();
  OptimizerShard(const OptimizerShard&) = delete;
  OptimizerShard& operator=(const OptimizerShard&) = delete;

  /// student.shard gradients: the gradients are this rank's slice (reduce(), clip_grad_norm()).
  bool owns_gradients() const { return scatter_ != nullptr; }
  /// Before the step's backward (gradients: drops the grads and arms the scatter; else nothing).
  void begin_step();
  /// gradients: the step's reduce-scatter (GradientScatter::reduce). Collective.
  void reduce(std::int64_t step, const std::function<void()>& posted);
  /// gradients: scales the slice so the global norm (over every rank's slice) is at most
  /// `max_norm`, LibTorch's clip_grad_norm_ factor; returns that norm. Collective.
  torch::Tensor clip_grad_norm(double max_norm, std::int64_t step);
  /// Bytes of gradients this rank keeps between steps (gradients: its slice; else 0: the
  /// parameters' own .grad).
  std::uint64_t gradient_bytes() const;
  const GradientScatter* scatter() const { return scatter_.get(); }
  /// student.shard parameters: the blocks' gate (null otherwise).
  ParameterGather* gate() const { return gate_.get(); }
  /// Bytes of weights this rank holds between steps (parameters: its slice and the root
  /// parameters; else every parameter).
  std::uint64_t weight_bytes() const;

  /// The tensors the optimizer steps: this rank's views (an empty slice gives none).
  const std::vector<torch::Tensor>& views() const { return views_; }
  const std::vector<Segment>& segments() const { return segments_; }
  std::int64_t slice_begin() const { return begin_; }
  std::int64_t slice_size() const { return slice_; }
  int group_size() const { return group_size_; }
  /// Elements of the flat layout before padding (every parameter, held or not).
  std::int64_t parameter_count() const { return total_; }

  /// After the optimizer stepped the views: every rank's slice to every rank (parameters: only the
  /// root parameters'; the blocks are gathered at their next use) (an all-gather through the
  /// reducer's buffer, which the step no longer needs, or with `gradients` a buffer of the step;
  /// over MPI staged through pinned host memory for device parameters, over NCCL on the device),
  /// copied into the parameters; the reducer's buffer (the grads) is left zeroed. Collective;
  /// waits with deadline, polling `health`.
  void gather(std::int64_t step);
  /// The backend of the reduce-scatter and all-gather ("mpi" or "nccl").
  const char* backend() const { return collectives_->backend(); }
  /// Testing aid (--inject-fault ...:allgather): runs inside every gather(step), once this rank's
  /// part of the all-gather is posted and before it waits.
  void set_fault_hook(comm::FaultHook hook) { fault_hook_ = std::move(hook); }

  /// This rank's slice of the AdamW moments for a checkpoint, with the group's step count.
  /// Collective (one small all-reduce with deadline).
  MomentSlice moment_slice(const torch::optim::AdamW& optimizer, std::int64_t step) const;

 private:
  void join_group();
  /// The gradients and parameters constructors: the layout, this rank's gradient slice, the
  /// scatter, and with `blocks` the owned weights and their gate.
  void scatter_gradients(std::uint64_t bucket_bytes, std::vector<torch::Tensor> sources,
                         const std::vector<std::vector<std::size_t>>* blocks);
  /// Offsets, this rank's slice of `padded` elements, its segments and views.
  void lay_out(std::int64_t padded);

  MPI_Comm comm_;
  std::shared_ptr<comm::ShardCollectives> collectives_;
  std::vector<torch::Tensor> params_;
  torch::Tensor whole_;
  torch::Tensor host_;  ///< pinned twin of whole_ when it is on a device and the collectives work on the host
  std::vector<std::int64_t> offsets_;  ///< each parameter's first element in the flat layout
  std::vector<Segment> segments_;
  std::vector<torch::Tensor> views_;
  std::int64_t begin_ = 0, slice_ = 0, padded_ = 0, total_ = 0;
  torch::Tensor grad_slice_;  ///< gradients: this rank's averaged gradients
  std::unique_ptr<GradientScatter> scatter_;
  torch::Tensor owned_;  ///< parameters: this rank's slice of the master weights (the views' storage)
  std::unique_ptr<ParameterGather> gate_;
  int group_size_ = 1, group_rank_ = 0;
  std::vector<int> peers_;
  std::chrono::duration<double> timeout_;
  int world_rank_;
  comm::HealthChannel* health_;
  comm::FaultHook fault_hook_;
};

/// The weights of a trainable model (`params`) this rank keeps between steps: `shard`'s (its
/// slice under student.shard parameters, and the blocks' outside), or all of them without one.
std::uint64_t kept_weight_bytes(const std::vector<torch::Tensor>& params, const OptimizerShard* shard);
/// A trainable model's weights, gradients and optimizer state on this rank (the memory reports,
/// the OOM diagnosis): under student.shard gradients the .grad are gone between steps and the
/// shard's gradient slice is what stays.
memory::ModelMemory model_memory(const std::vector<torch::Tensor>& params, const OptimizerShard* shard,
                                 const torch::optim::Optimizer& optimizer);

/// student.shard parameters: every block of `shard`'s model whole while this guard lives (a
/// checkpoint's write, a resume's read: collective over the students), let go after; nothing for
/// other modes or none.
class WholeWeights {
 public:
  explicit WholeWeights(OptimizerShard* shard) : gate_(shard ? shard->gate() : nullptr) {
    if (gate_) gate_->gather_all();
  }
  ~WholeWeights() {
    if (gate_) gate_->rest_and_trim();
  }
  WholeWeights(const WholeWeights&) = delete;
  WholeWeights& operator=(const WholeWeights&) = delete;
  /// After a resume loaded the weights: each rank's slice taken from them.
  void adopt() {
    if (gate_) gate_->adopt();
  }

 private:
  ParameterGather* gate_;
};

/// student.shard gradients in the reducer's place: average(step) is the shard's reduce-scatter,
/// so the step and the fault wiring (`allreduce`) stay those of every reducer.
class ShardReducer final : public comm::GradientReducer {
 public:
  ShardReducer(OptimizerShard& shard, comm::HealthChannel* health) : GradientReducer(health), shard_(shard) {}
  void average(std::int64_t step) override {
    shard_.reduce(step, [this, step] { fault_point(step); });
  }
  std::size_t bucket_count() const override { return shard_.scatter()->bucket_count(); }
  double wait_seconds() const override { return shard_.scatter()->wait_seconds(); }
  const char* backend() const override {
    return std::string_view(shard_.backend()) == "nccl" ? "nccl reduce-scatter" : "mpi reduce-scatter";
  }

 private:
  OptimizerShard& shard_;
};

}  // namespace wd::student
