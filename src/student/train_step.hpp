// train_step: one optimizer step of a trainable model, written once for the student loop, the
// speed calibration and the tests; what is trained and its loss plug in as an Objective.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "comm/gradient_reducer.hpp"
#include "comm/message_spec.hpp"
#include "student/optimizer_shard.hpp"
#include "student/train_optimizer.hpp"
#include "student/student_config.hpp"

namespace wd::student {

/// A training target: the tensors it trains and the loss of one micro-batch. The only seam a
/// new objective or a second trainable model (a critic) implements; the step around it stays.
class Objective {
 public:
  virtual ~Objective() = default;
  /// The tensors the optimizer steps and the clip sees (fixed after start-up).
  virtual const std::vector<torch::Tensor>& parameters() const = 0;
  /// Zeroes the gradients before a step's first micro-batch.
  virtual void zero_grad() = 0;
  /// Forward, loss and backward of `scale`·loss over `batch`, gradients accumulated; returns the
  /// unscaled loss as a detached 0-d tensor on the device (the step reads it on the host).
  virtual torch::Tensor backward(const comm::TensorDict& batch, double scale) = 0;
  /// After the optimizer step, e.g. to refresh a bf16 compute copy from the master weights.
  virtual void after_step() {}
};

/// Where a step's micro-batches come from: the teacher stream while training, fixed batches
/// when timing or testing.
class MicroBatches {
 public:
  virtual ~MicroBatches() = default;
  /// Micro-batches per optimizer step.
  virtual std::int64_t count() const = 0;
  /// Micro-batch `micro` of step `step`; valid until release(step, micro).
  virtual const comm::TensorDict& take(std::int64_t step, std::int64_t micro) = 0;
  /// The step is done with the micro-batch (a ring slot may be reused).
  virtual void release(std::int64_t step, std::int64_t micro) {}
};

/// The same batches at every step, one per micro-batch.
class FixedBatches final : public MicroBatches {
 public:
  explicit FixedBatches(std::vector<comm::TensorDict> batches) : batches_(std::move(batches)) {}
  std::int64_t count() const override { return static_cast<std::int64_t>(batches_.size()); }
  const comm::TensorDict& take(std::int64_t, std::int64_t micro) override {
    return batches_.at(static_cast<std::size_t>(micro));
  }

 private:
  std::vector<comm::TensorDict> batches_;
};

/// What train_step works with; owned by the caller, the same for every step of a run.
struct StepContext {
  Objective& objective;
  TrainOptimizer& optimizer;                 ///< whole or sharded: the step does not ask which
  comm::GradientReducer* reducer = nullptr;  ///< averages over the student group; null: alone
  double grad_clip = 0;                      ///< largest global gradient 2-norm; 0: no clipping
  int world_rank = 0;                        ///< named when a loss is not finite
  std::function<void()> after_step;          ///< the caller's hook after the update; may be empty
};

/// Optimizer step `step` (0-based) at learning rate `lr`: each micro-batch's backward of
/// loss / count, one host read of the losses (the step's one counted sync), a NumericalError on
/// NaN/Inf before the gradients leave this rank, the reduce, the clip and the optimizer's step
/// (TrainOptimizer: AdamW, fused on CUDA; under student.shard on this rank's slice, then the
/// all-gather), then the objective's and the caller's
/// after-step hooks. Returns this rank's mean loss.
double train_step(StepContext& ctx, std::int64_t step, double lr, MicroBatches& batches);

/// Scales the gradients of `params` so their global 2-norm is at most `max_norm`, exactly as
/// LibTorch's clip_grad_norm_ does, without reading the norm on the host; returns the norm
/// (before clipping) as a 0-d tensor on the gradients' device.
torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace wd::student
