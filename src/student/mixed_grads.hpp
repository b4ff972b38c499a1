// Mixed precision's gradient fold: a bf16 compute copy's grad added into its fp32 master's.
#pragma once

#include <torch/torch.h>

namespace wd::student {

/// Adds `compute`'s grad (bf16 under bf16-mixed) into `master`'s fp32 grad, creating it when
/// missing, and drops `compute`'s; nothing when `compute` has no grad. StudentParts::backward folds
/// every pair after the backward, the sharded reduce-scatter each bucket's as it sends it.
inline void fold_compute_grad(torch::Tensor& master, torch::Tensor& compute) {
  torch::Tensor& from = compute.mutable_grad();
  if (!from.defined()) return;
  torch::NoGradGuard no_grad;
  torch::Tensor& grad = master.mutable_grad();
  if (grad.defined()) {
    grad.add_(from);
  } else {
    grad = from.to(torch::kFloat);
  }
  from = torch::Tensor();
}

}  // namespace wd::student
