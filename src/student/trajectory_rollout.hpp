// train.trajectory_rollout: trajectory samples whose input is the student's own state. A
// trajectory student trained only at the teacher's states meets, when it samples, the states its
// own earlier jumps reached, which are off the teacher's path by its errors; they compound over
// the k steps. For a fraction of each batch the student first jumps from the trajectory's noise
// with its own current weights (no gradient) to σ_i, and learns the jump from there to the
// teacher's state at σ_{i+1}: the way back to the teacher's path (docs/objectives.md#trajectory).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "comm/message_spec.hpp"
#include "student/student_parts.hpp"
#include "student/train_step.hpp"

namespace wd::student {

/// Each sample's student interval: the i < k whose σ_i (of the k + 1 `sigmas`) is nearest to its
/// t / 1000 (t is [B] or per token [B,S]; a tie goes to the earlier interval). [B] int64 on the host.
torch::Tensor nearest_interval(const torch::Tensor& t, const std::vector<double>& sigmas);

/// `batch` with its first round(fraction·B) samples rolled out: for each of them at interval
/// i ≥ 1 (found as the σ of `sigmas` nearest to its t / 1000), x_t = the state the student's i
/// Euler jumps from `x_start` reach (predict with the current weights, t = 1000·σ_j, its own
/// context) and teacher_out = (x_{i+1} − x_t) / (σ_{i+1} − σ_i), where x_{i+1} = the teacher's
/// state the sample's own target jumps to. Samples at interval 0 (their input is the noise) and
/// the rest of the batch are unchanged; every other tensor is passed through. `sigmas` are the
/// student's k + 1 σ (σ_0 ≈ 1 ... σ_k = 0). Needs `x_start` in the batch.
comm::TensorDict roll_out(StudentParts& parts, const comm::TensorDict& batch, const std::vector<double>& sigmas,
                          double fraction);

/// An Objective whose batches go through roll_out() before `inner` sees them.
class RolloutObjective final : public Objective {
 public:
  RolloutObjective(StudentParts& parts, Objective& inner, std::vector<double> sigmas, double fraction)
      : parts_(parts), inner_(inner), sigmas_(std::move(sigmas)), fraction_(fraction) {}
  const std::vector<torch::Tensor>& parameters() const override { return inner_.parameters(); }
  void zero_grad() override { inner_.zero_grad(); }
  torch::Tensor backward(const comm::TensorDict& batch, double scale) override {
    return inner_.backward(roll_out(parts_, batch, sigmas_, fraction_), scale);
  }
  void after_step() override { inner_.after_step(); }

 private:
  StudentParts& parts_;
  Objective& inner_;
  std::vector<double> sigmas_;
  double fraction_;
};

}  // namespace wd::student
