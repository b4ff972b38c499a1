// StudentParts: projections, feature heads, mixed precision, and the micro-step.
#include "student/student_parts.hpp"

#include "student/mixed_grads.hpp"

#include <spdlog/spdlog.h>

#include <array>
#include <cmath>
#include <filesystem>

#include "core/errors.hpp"
#include "core/host_sync.hpp"
#include "core/torch_compat.hpp"
#include "model/image_condition.hpp"
#include "model/wan_experts.hpp"
#include "model/wan_lora.hpp"
#include "student/student_model.hpp"
#include "student/token_loss.hpp"

namespace wd::student {

namespace {

/// A linear layer whose weight has orthonormal rows (or columns): it keeps the scale of what
/// it maps, unlike a zero init, which would hand the DiT nothing but zeros.
torch::nn::Linear semi_orthogonal(std::int64_t in, std::int64_t out, std::uint64_t seed) {
  torch::nn::Linear layer(torch::nn::LinearOptions(in, out));
  auto gen = at::detail::createCPUGenerator(seed);
  torch::NoGradGuard no_grad;
  if (out <= in) {
    auto q = std::get<0>(torch::linalg_qr(torch::randn({in, out}, gen)));  // [in,out], orthonormal columns
    layer->weight.copy_(q.t());
  } else {
    layer->weight.copy_(std::get<0>(torch::linalg_qr(torch::randn({out, in}, gen))));
  }
  layer->bias.zero_();
  return layer;
}

/// Applies a channel projection to [B,C,F,H,W] (a 1x1x1 convolution as a matmul).
torch::Tensor over_channels(torch::nn::LinearImpl& layer, const torch::Tensor& x) {
  return layer.forward(x.movedim(1, -1)).movedim(-1, 1);
}

std::string head_name(std::int64_t s, std::int64_t t) {
  return "feature_" + std::to_string(s) + "_" + std::to_string(t);
}

/// A feature head with LibTorch's default Linear ranges (U(±1/sqrt(in))) drawn from its own
/// seeded generator: every student rank and every run starts from the same head, whatever
/// else used the global generator before.
torch::nn::Linear seeded_linear(std::int64_t in, std::int64_t out, std::uint64_t seed) {
  torch::nn::Linear layer(torch::nn::LinearOptions(in, out));
  auto gen = at::detail::createCPUGenerator(seed);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  torch::NoGradGuard no_grad;
  layer->weight.copy_(torch::rand({out, in}, gen).mul_(2 * bound).sub_(bound));
  layer->bias.copy_(torch::rand({out}, gen).mul_(2 * bound).sub_(bound));
  return layer;
}

}  // namespace

torch::Tensor distill_loss(const torch::Tensor& prediction, const torch::Tensor& teacher_out,
                           const torch::Tensor& weights) {
  const auto& target = teacher_out.scalar_type() == prediction.scalar_type()
                           ? teacher_out
                           : teacher_out.to(prediction.scalar_type());
  return frame_weighted_mse(prediction, target, weights);
}

MicroLossValues MicroLosses::read() const {
  const auto values = torch::stack({total, output, features}).to(torch::kDouble);
  note_host_sync("micro-step losses");
  const auto host = values.cpu();
  const auto* v = host.data_ptr<double>();
  return {v[0], v[1], v[2]};
}

StudentParts::StudentParts(WanDiT model, const PartsSetup& setup) : StudentParts(std::move(model), nullptr, setup) {}

StudentParts StudentParts::pair(WanDiT high, WanDiT low, const PartsSetup& setup) {
  WD_CHECK(!high.is_empty() && !low.is_empty() && high->lora().rank > 0 && low->lora().rank > 0,
           "a LoRA pair needs two LoRA DiTs (add_lora done on both)");
  WD_CHECK(static_cast<bool>(setup.router), "a LoRA pair needs the router that sends each sample to its expert");
  return StudentParts(std::move(high), std::move(low), setup);
}

StudentParts::StudentParts(WanDiT model, WanDiT low, const PartsSetup& setup)
    : setup_(setup), model_(std::move(model)), compute_(model_), low_(std::move(low)) {
  const auto& c = model_->config();
  if (is_pair()) {
    WD_CHECK_AS(ConfigError, setup_.feature_pairs.empty(),
                "student.features with a LoRA pair (one adapter set per expert) is not built");
    WD_CHECK_AS(ConfigError, !setup_.gan, "critic.gan_weight with a LoRA pair critic (one adapter set per expert) is "
                                          "not built");
    WD_CHECK(c.in_dim == setup_.teacher_in_channels && c.out_dim == setup_.teacher_out_channels,
             "a LoRA pair has the teacher's channels: no projections");
  }
  // The job refuses these before training (job/sequence_parallel.cpp): the parts split none of them.
  WD_CHECK(!setup_.sequence_parallel || (setup_.feature_pairs.empty() && c.in_dim == setup_.teacher_in_channels &&
                                          c.out_dim == setup_.teacher_out_channels),
           "student.sequence_parallel with student.features or channel projections");
  if (c.in_dim != setup_.teacher_in_channels) {
    heads_->update({{"in_proj", semi_orthogonal(setup_.teacher_in_channels, c.in_dim, setup_.seed + 1).ptr()}});
  }
  if (c.out_dim != setup_.teacher_out_channels) {
    heads_->update({{"out_proj", semi_orthogonal(c.out_dim, setup_.teacher_out_channels, setup_.seed + 2).ptr()}});
  }
  for (const auto& [s, t] : setup_.feature_pairs) {
    WD_CHECK_AS(ConfigError, s >= 0 && s < c.num_layers,
                "student.features names student block " << s << "; the student has blocks 0.." << c.num_layers - 1);
    const auto seed = setup_.seed + 16 + static_cast<std::uint64_t>(s) * 1009 + static_cast<std::uint64_t>(t);
    heads_->update({{head_name(s, t), seeded_linear(c.dim, setup_.teacher_dim, seed).ptr()}});
  }
  if (setup_.gan) {
    gan_block_ = setup_.gan_block < 0 ? c.num_layers - 1 : setup_.gan_block;
    WD_CHECK_AS(ConfigError, gan_block_ >= 0 && gan_block_ < c.num_layers,
                "critic.gan_block(" << setup_.gan_block << ") names a block the critic lacks: it has blocks 0.."
                                    << c.num_layers - 1 << " (-1 = the last)");
    heads_->update({{"gan_in", seeded_linear(c.dim, c.dim, setup_.seed + 0x6A40).ptr()}});
    heads_->update({{"gan_out", seeded_linear(c.dim, 1, setup_.seed + 0x6A41).ptr()}});
  }
  // Initialised on the host (a seeded CPU generator gives every device the same start), moved
  // once; parameters keep their identity, so nothing below sees a host tensor.
  heads_->to(setup_.device);
  if (is_pair()) {
    add_trainable(model_, std::string(WanExperts::kHighDir) + ".");
    add_trainable(low_, std::string(WanExperts::kLowDir) + ".");
  } else {
    add_trainable(model_, "");
  }
  for (const auto& item : heads_->named_parameters()) {
    const bool projection = item.key().rfind("in_proj", 0) == 0 || item.key().rfind("out_proj", 0) == 0;
    if (projection && !setup_.train_projections) {
      item.value().set_requires_grad(false);
      continue;
    }
    trainable_.push_back(item.value());
    trainable_names_.push_back("distill_heads." + item.key());
  }
  // A LoRA student computes in its base's dtype (bf16 under bf16-mixed) with fp32 adapters cast
  // per use: no copy.
  if (setup_.mixed_bf16 && model_->lora().rank == 0) {
    // The bf16 copy is made once; after each optimizer step it is refreshed in place.
    compute_ = WanDiT(c, WanInit::kEmpty, torch::kBFloat16);
    for (const auto& p : model_->named_parameters()) {
      auto copy = p.value().detach().to(torch::kBFloat16);
      compute_->bind_parameter(p.key(), copy);
    }
    compute_->to(setup_.device);  // its buffers (the parameters are device copies already)
    for (const auto& p : compute_->named_parameters()) {
      master_compute_.emplace_back(model_->named_parameters()[p.key()], p.value());
    }
  }
  spdlog::debug("student parts: {} modules, {} parameter tensors ({} trainable)", module_count(),
                parameter_count(), trainable_.size());
}

void StudentParts::add_trainable(WanDiT& dit, const std::string& prefix) {
  dit->to(setup_.device);
  for (const auto& p : dit->named_parameters()) {
    if (!p.value().requires_grad()) continue;  // a LoRA student's frozen base
    trainable_.push_back(p.value());
    trainable_names_.push_back(prefix + p.key());
  }
}

std::vector<WanDiT> StudentParts::models() const {
  if (is_pair()) return {model_, low_};
  return {model_};
}

torch::Tensor StudentParts::forward_pair(const WanInputs& in, const CheckpointPolicy& policy, bool tokens) {
  // The router's order is WanExperts' own: {kLow, kHigh}.
  const auto routes = setup_.router(in.t);
  WD_CHECK(routes.size() == 2, "the router of a LoRA pair gave " << routes.size() << " routes, not 2");
  std::array<WanDiT*, 2> experts{};
  experts[WanExperts::kLow] = &low_;
  experts[WanExperts::kHigh] = &model_;
  return torch::stack(routed_forward(routes, in, model_->config().patch_size,
                                     [&](std::size_t e, const WanInputs& samples) {
                                       // Under sequence parallelism, each sample's rows of this rank's tokens.
                                       return tokens ? student_forward_tokens(*experts[e], samples, policy).unbind(0)
                                                     : student_forward(*experts[e], samples, policy, nullptr);
                                     }));
}

torch::Tensor StudentParts::project_in(const torch::Tensor& x_t) {
  return heads_->contains("in_proj") ? over_channels(*heads_["in_proj"]->as<torch::nn::Linear>(), x_t) : x_t;
}

torch::Tensor StudentParts::project_out(const torch::Tensor& y) {
  return heads_->contains("out_proj") ? over_channels(*heads_["out_proj"]->as<torch::nn::Linear>(), y) : y;
}

WanInputs StudentParts::inputs_of(const comm::TensorDict& b) {
  // Sampling (predict) passes inputs alone; a training batch also carries its targets.
  for (const auto* name : {"x_t", "teacher_out"}) {
    const auto it = b.find(name);
    WD_CHECK(name != std::string("x_t") || it != b.end(), "a student batch needs x_t");
    WD_CHECK(it == b.end() || it->second.device() == setup_.device,
             "a student batch must arrive on the student's device " << setup_.device << "; " << name << " is on "
                                                                    << it->second.device());
  }
  const auto y = b.find("y");  // an i2v teacher's image condition (StreamPlan::condition_channels)
  auto in = WanInputs::batched(project_in(b.at("x_t")), b.at("t"), b.at("context"), b.at("context_lens"), 0,
                               y == b.end() ? torch::Tensor() : y->second);
  in.sequence_parallel = setup_.sequence_parallel;
  return in;
}

torch::Tensor StudentParts::forward(WanDiT& dit, const comm::TensorDict& b, const CheckpointPolicy& policy,
                                    std::map<std::int64_t, torch::Tensor>* hidden) {
  const auto in = inputs_of(b);
  if (is_pair()) return forward_pair(in, policy);  // a pair: no projections, no feature heads
  return project_out(torch::stack(student_forward(dit, in, policy, hidden, gate_)));
}

MicroLosses StudentParts::micro_step(const comm::TensorDict& batch, double scale,
                                     const CheckpointPolicy& policy) {
  std::map<std::int64_t, torch::Tensor> hidden;
  for (const auto& [s, t] : setup_.feature_pairs) hidden[s] = torch::Tensor();
  MicroLosses losses;
  auto loss = setup_.sequence_parallel
                  ? token_loss(batch, policy)
                  : distill_loss(forward(compute_, batch, policy, &hidden), batch.at("teacher_out"), frame_weights(batch));
  losses.output = loss.detach().to(torch::kFloat);
  losses.features = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(setup_.device));
  if (!setup_.feature_pairs.empty()) {
    torch::Tensor feature_loss = losses.features;
    for (const auto& [s, t] : setup_.feature_pairs) {
      auto mapped = heads_[head_name(s, t)]->as<torch::nn::Linear>()->forward(hidden[s].to(torch::kFloat));
      feature_loss = feature_loss + distill_loss(mapped, batch.at("feat." + std::to_string(t)));
    }
    feature_loss = feature_loss / static_cast<double>(setup_.feature_pairs.size());
    losses.features = feature_loss.detach();
    loss = loss + setup_.feature_weight * feature_loss;
  }
  losses.total = loss.detach().to(torch::kFloat);
  backward(loss * scale);
  return losses;
}

torch::Tensor StudentParts::token_loss(const comm::TensorDict& batch, const CheckpointPolicy& policy) {
  const auto in = inputs_of(batch);
  const auto rows = is_pair() ? forward_pair(in, policy, /*tokens=*/true)
                              : student_forward_tokens(compute_, in, policy, nullptr, gate_);
  return token_distill_loss(rows, batch.at("teacher_out"), frame_weights(batch), model_->config().patch_size,
                            *setup_.sequence_parallel);
}

torch::Tensor StudentParts::frame_weights(const comm::TensorDict& batch) const {
  return frame_loss_weights(batch.at("t"), batch.at("x_t"), model_->config().patch_size);
}

torch::Tensor StudentParts::forward_train(const comm::TensorDict& batch, const CheckpointPolicy& policy) {
  return forward(compute_, batch, policy, nullptr);
}

void StudentParts::backward(const torch::Tensor& loss) {
  loss.backward();
  if (gate_) gate_->rest();  // the backward ends holding the first block
  // Mixed precision: the bf16 grads are folded into the fp32 master grads, then dropped.
  for (auto& [master, compute] : master_compute_) fold_compute_grad(master, compute);
}

torch::Tensor StudentParts::realism(const comm::TensorDict& batch, const CheckpointPolicy& policy) {
  WD_CHECK(gan_block_ >= 0, "this model has no realism classifier (critic.gan_weight 0)");
  std::map<std::int64_t, torch::Tensor> hidden{{gan_block_, torch::Tensor()}};
  static_cast<void>(forward(compute_, batch, policy, &hidden));  // the blocks after gan_block_ are not read
  auto h = pool_tokens(hidden.at(gan_block_).to(torch::kFloat), batch.at("x_t"));  // [B, L, dim] -> [B, dim]
  h = torch::layer_norm(h, {h.size(-1)});
  h = torch::silu(heads_["gan_in"]->as<torch::nn::Linear>()->forward(h));
  return heads_["gan_out"]->as<torch::nn::Linear>()->forward(h).squeeze(-1);
}

torch::Tensor StudentParts::pool_tokens(const torch::Tensor& hidden, const torch::Tensor& x_t) const {
  auto* group = setup_.sequence_parallel;
  if (!group) return hidden.mean(1);
  // This rank's real rows (its run of the padded sequence, less the padding), summed, then the
  // group's sums added (gather_tokens: its backward hands each rank the group's gradients of
  // its own sum, as one rank's mean would): the mean over every token of the sample.
  const auto S = latent_tokens(x_t, model_->config().patch_size);
  const auto span = group->span(S);
  WD_CHECK(hidden.size(1) == span.local(), "the hidden states of rank " << group->rank() << " hold " << hidden.size(1)
                                                                        << " tokens, its span " << span.local());
  const auto mine = hidden.narrow(1, 0, span.real(S)).sum(1, /*keepdim=*/true);  // [B, 1, dim]
  return group->gather_tokens(mine).sum(1) / static_cast<double>(S);
}

torch::Tensor StudentParts::predict(const comm::TensorDict& batch) {
  torch::NoGradGuard no_grad;
  return forward(compute_, batch, CheckpointPolicy::parse("off"), nullptr);
}

std::vector<torch::Tensor> StudentParts::grad_sources() const {
  std::vector<torch::Tensor> out = trainable_;
  for (auto& t : out) {
    for (const auto& [master, compute] : master_compute_) {
      if (master.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) t = compute;
    }
  }
  return out;
}

std::vector<std::vector<std::size_t>> StudentParts::block_units() const {
  std::vector<std::vector<std::size_t>> units;
  for (std::int64_t b = 0; b < model_->config().num_layers; ++b) {
    std::vector<std::size_t> unit;
    for (const auto& p : model_->block_parameters(b)) {
      for (std::size_t i = 0; i < trainable_.size(); ++i) {
        if (trainable_[i].unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) unit.push_back(i);
      }
    }
    units.push_back(std::move(unit));
  }
  return units;
}

void StudentParts::zero_grad() {
  std::vector<torch::Tensor> grads;
  for (auto& p : trainable_) {
    if (p.grad().defined()) grads.push_back(p.mutable_grad());
  }
  compat::zero_all(grads);
}

void StudentParts::after_optimizer_step() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> to, from;
  for (auto& [master, compute] : master_compute_) {
    to.push_back(compute);
    from.push_back(master);
  }
  compat::copy_all(to, from);
}

std::size_t StudentParts::module_count() const {
  return model_->modules().size() + heads_->modules().size() + (is_pair() ? low_->modules().size() : 0) +
         (compute_.get() != model_.get() ? compute_->modules().size() : 0);
}

std::size_t StudentParts::parameter_count() const {
  return model_->parameters().size() + heads_->parameters().size() + (is_pair() ? low_->parameters().size() : 0) +
         (compute_.get() != model_.get() ? compute_->parameters().size() : 0);
}

void StudentParts::save(const std::string& dir) const {
  if (is_pair()) {
    // The pair's folders, as a student.expert run of each expert writes its RUN/student.
    write_lora_folder(*model_, (std::filesystem::path(dir) / WanExperts::kHighDir).string(), setup_.lora_base);
    write_lora_folder(*low_, (std::filesystem::path(dir) / WanExperts::kLowDir).string(), setup_.lora_base_low);
  } else if (model_->lora().rank > 0) {
    write_lora_folder(*model_, dir, setup_.lora_base);
  } else {
    WanDiT model = model_;  // a second holder of the same module: save_student takes a mutable one
    save_student(model, dir);
  }
  if (heads_->parameters().empty()) return;
  TensorMap tensors;
  for (const auto& p : heads_->named_parameters()) tensors[p.key()] = p.value().detach();
  // A subfolder: the checkpoint folder itself must hold exactly one .safetensors for loaders.
  std::filesystem::create_directories(dir + "/distill_heads");
  write_safetensors(dir + "/distill_heads/heads.safetensors", tensors,
                    {{"format", "pt"}, {"producer", "wan-distill train"}});
}

}  // namespace wd::student
