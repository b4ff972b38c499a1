// train_step and the gradient clip it uses: accumulate, check, reduce, clip, AdamW, hooks.
#include "student/train_step.hpp"

#include <cmath>

#include "core/errors.hpp"
#include "core/host_sync.hpp"

namespace wd::student {

double train_step(StepContext& ctx, std::int64_t step, double lr, MicroBatches& batches) {
  ctx.optimizer.set_lr(lr);
  ctx.objective.zero_grad();
  ctx.optimizer.begin_step();  // student.shard gradients: the scatter's hooks listen
  const auto count = batches.count();
  const double micro_scale = 1.0 / static_cast<double>(count);
  std::vector<torch::Tensor> micro_losses;  // on the device until the step reads them once
  for (std::int64_t micro = 0; micro < count; ++micro) {
    // backward() releases its prediction, loss and graph when it returns; release() then hands
    // the batch's ring slot back, so nothing of this micro-batch survives into the next
    // receive. Only the accumulated grads stay.
    micro_losses.push_back(ctx.objective.backward(batches.take(step, micro), micro_scale));
    batches.release(step, micro);
  }
  // Before the gradients leave this rank: a NaN must not reach the other students' weights.
  // The step's one read of its losses (a host synchronisation on a GPU).
  const auto losses = torch::stack(micro_losses).to(torch::kDouble);
  note_host_sync("step losses");
  const auto host_losses = losses.cpu();
  const auto* values = host_losses.data_ptr<double>();
  double mean = 0.0;
  for (std::int64_t micro = 0; micro < count; ++micro) {
    const double loss = values[micro];
    WD_CHECK_AS(NumericalError, std::isfinite(loss),
                "the loss of step " << step + 1 << " (micro-batch " << micro << ") is " << loss << " on rank "
                                    << ctx.world_rank);
    mean += micro_scale * loss;
  }
  if (ctx.reducer) ctx.reducer->average(step);
  // The global norm either way: over every rank's slice when the shard owns the gradients.
  if (ctx.grad_clip > 0) ctx.optimizer.clip(ctx.objective.parameters(), ctx.grad_clip, step);
  ctx.optimizer.step(step);
  ctx.objective.after_step();
  if (ctx.after_step) ctx.after_step();
  return mean;
}

torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  std::vector<torch::Tensor> norms;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    grads.push_back(p.grad());
    norms.push_back(p.grad().norm(2.0));
  }
  if (grads.empty()) return torch::zeros({});
  // The operations of LibTorch's clip_grad_norm_, in its order (the same bits), without its
  // closing .item(): the clamped factor multiplies on the device; a factor of 1 changes nothing.
  const auto total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2.0);
  const auto factor = torch::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  torch::NoGradGuard no_grad;
  for (auto& g : grads) g.mul_(factor);
  return total;
}

}  // namespace wd::student
