// TrainOptimizer: a trainable model's AdamW behind one face, whole or sharded (student.shard), as
// Megatron's distributed optimizer stands behind the plain one's interface.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "student/optimizer_shard.hpp"
#include "student/student_config.hpp"

namespace wd::student {

/// The optimizer of one trainable model (the student, dmd's critic). Whole: AdamW over every
/// parameter. Sharded (student.shard optimizer|gradients|parameters): AdamW over the shard's views
/// of this rank's slice, the updated slices all-gathered after each step. The same operations
/// either way, so a step never asks which.
class TrainOptimizer {
 public:
  /// AdamW with `options` over `params`, or with `shard` (not owned; it outlives this) over its
  /// views of this rank's slice of them.
  TrainOptimizer(const std::vector<torch::Tensor>& params, const torch::optim::AdamWOptions& options,
                 OptimizerShard* shard = nullptr);
  TrainOptimizer(const TrainOptimizer&) = delete;
  TrainOptimizer& operator=(const TrainOptimizer&) = delete;

  /// [train]'s AdamW at learning rate `lr`: its betas and weight decay.
  static torch::optim::AdamWOptions options(double lr, const TrainConfig& train);

  /// The learning rate of the next step.
  void set_lr(double lr);
  /// Before the step's backward (student.shard gradients: drops the grads and arms the scatter).
  void begin_step();
  /// Scales the gradients of `params` so their global 2-norm is at most `max_norm`: over every
  /// rank's slice when the shard owns the gradients (collective), else over `params`.
  void clip(const std::vector<torch::Tensor>& params, double max_norm, std::int64_t step);
  /// The update of step `step` (LibTorch's fused kernel on CUDA, the per-parameter one on the
  /// host), then under student.shard the all-gather of the slices (collective).
  void step(std::int64_t step);

  torch::optim::AdamW& adamw() { return *adamw_; }
  const torch::optim::AdamW& adamw() const { return *adamw_; }
  /// This rank's slice under student.shard; null: whole.
  OptimizerShard* shard() const { return shard_; }

 private:
  std::unique_ptr<torch::optim::AdamW> adamw_;
  OptimizerShard* shard_;
};

}  // namespace wd::student
