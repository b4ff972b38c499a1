// TrainOptimizer (train_optimizer.hpp).
#include "student/train_optimizer.hpp"

#include "core/torch_compat.hpp"
#include "student/train_step.hpp"

namespace wd::student {

TrainOptimizer::TrainOptimizer(const std::vector<torch::Tensor>& params, const torch::optim::AdamWOptions& options,
                               OptimizerShard* shard)
    : adamw_(std::make_unique<torch::optim::AdamW>(shard ? shard->views() : params, options)), shard_(shard) {}

torch::optim::AdamWOptions TrainOptimizer::options(double lr, const TrainConfig& train) {
  return torch::optim::AdamWOptions(lr).betas({train.beta1, train.beta2}).weight_decay(train.weight_decay);
}

void TrainOptimizer::set_lr(double lr) {
  for (auto& group : adamw_->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
}

void TrainOptimizer::begin_step() {
  if (shard_) shard_->begin_step();
}

void TrainOptimizer::clip(const std::vector<torch::Tensor>& params, double max_norm, std::int64_t step) {
  if (shard_ && shard_->owns_gradients()) {
    shard_->clip_grad_norm(max_norm, step);
  } else {
    clip_grad_norm(params, max_norm);
  }
}

void TrainOptimizer::step(std::int64_t step) {
  if (!compat::fused_adamw_step(*adamw_)) adamw_->step();
  if (shard_) shard_->gather(step);
}

}  // namespace wd::student
