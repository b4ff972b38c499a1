// DistillObjective: today's training target, the student parts matching the teacher's outputs
// (and hidden states), as the Objective that train_step steps.
#pragma once

#include <utility>
#include <vector>

#include "student/checkpointing.hpp"
#include "student/student_parts.hpp"
#include "student/train_step.hpp"

namespace wd::student {

/// The distillation loss of StudentParts::micro_step over its trainable tensors.
class DistillObjective final : public Objective {
 public:
  /// `policy` names the blocks recomputed in the backward.
  DistillObjective(StudentParts& parts, CheckpointPolicy policy) : parts_(parts), policy_(std::move(policy)) {}
  const std::vector<torch::Tensor>& parameters() const override { return parts_.trainable(); }
  void zero_grad() override { parts_.zero_grad(); }
  torch::Tensor backward(const comm::TensorDict& batch, double scale) override {
    return parts_.micro_step(batch, scale, policy_).total;
  }
  void after_step() override { parts_.after_optimizer_step(); }

 private:
  StudentParts& parts_;
  CheckpointPolicy policy_;
};

}  // namespace wd::student
