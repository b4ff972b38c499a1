// StudentParts: everything a student trains, created once at start-up: the DiT, the channel
// projections, the feature-distillation heads, and the bf16 compute copy of mixed precision.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "comm/message_spec.hpp"
#include "model/wan_dit.hpp"
#include "student/checkpointing.hpp"

namespace wd::student {

/// What StudentParts needs to know about the teacher stream and the config.
struct PartsSetup {
  std::int64_t teacher_in_channels = 0;   ///< C of x_t, plus y's channels with an i2v teacher: its in_dim
  std::int64_t teacher_out_channels = 0;  ///< C of teacher_out
  std::int64_t teacher_dim = 0;           ///< width of the teacher's hidden states
  /// (student block, teacher block) pairs whose hidden states are matched.
  std::vector<std::pair<std::int64_t, std::int64_t>> feature_pairs;
  double feature_weight = 0.0;
  bool train_projections = true;  ///< student.projection = trained | frozen
  bool mixed_bf16 = false;        ///< student.precision = bf16-mixed
  std::uint64_t seed = 0;
  c10::Device device = torch::kCPU;  ///< where every part lives and trains (student.device)
  /// LoRA student (a DiT with adapters, its base frozen): the base checkpoint its folder names
  /// (a LoRA pair: the high-noise expert's).
  std::string lora_base;
  /// A LoRA pair (StudentParts::pair): the low-noise expert's base, and the router that sends
  /// each sample to its expert by t, as the teacher routes it ({low, high}: WanExperts::route).
  std::string lora_base_low;
  std::function<std::vector<std::vector<std::int64_t>>(const torch::Tensor& t)> router;
  /// The dmd critic's realism classifier (critic.gan_weight > 0, DMD2's GAN head): a head on the
  /// hidden states after block gan_block (-1: the last), see StudentParts::realism.
  bool gan = false;
  std::int64_t gan_block = -1;
  /// student.sequence_parallel > 1: this rank's group (not owned; it outlives the parts). Every
  /// forward holds this rank's tokens; the training loss covers its rows (token_distill_loss)
  /// and predict() gathers the whole output. Null: off.
  TokenHeadExchange* sequence_parallel = nullptr;
};

/// Losses of one micro-batch (unscaled), as read on the host.
struct MicroLossValues {
  double total = 0;
  double output = 0;    ///< MSE to teacher_out
  double features = 0;  ///< mean MSE of the feature pairs (0 without pairs)
};

/// Losses of one micro-batch (unscaled), as detached 0-d fp32 tensors on the student's device:
/// the step keeps them there, so a CUDA student queues its backward without waiting for the
/// forward, and the host reads them once per step.
struct MicroLosses {
  torch::Tensor total;
  torch::Tensor output;    ///< MSE to teacher_out
  torch::Tensor features;  ///< mean MSE of the feature pairs (zero without pairs)
  /// The three on the host: one counted host synchronisation.
  MicroLossValues read() const;
};

/// Distillation loss: MSE between the student prediction and the teacher output (cast to the
/// prediction's dtype only when they differ), over the frames `weights` keeps
/// (frame_loss_weights: a clean image frame is left out; undefined: every frame).
torch::Tensor distill_loss(const torch::Tensor& prediction, const torch::Tensor& teacher_out,
                           const torch::Tensor& weights = torch::Tensor());

class StudentParts {
 public:
  /// Takes the fp32 student (the master weights); builds the projections when the student's
  /// channels differ from the teacher's (semi-orthogonal init: never zeros), one linear head
  /// per feature pair, and for bf16-mixed a bf16 copy of the DiT used for forward/backward.
  /// Everything is initialised on the host (the same values on every device) and then moved
  /// to setup.device once; batches must arrive on that device.
  StudentParts(WanDiT model, const PartsSetup& setup);
  /// A LoRA pair: the adapters of a two-expert (A14B) teacher's two experts, `high` and `low` each
  /// over its own frozen base, trained together; every forward sends each sample to its expert
  /// by t (setup.router) and puts the outputs back in batch order. Trainable names are prefixed
  /// with the expert's folder ("high_noise_model.", "low_noise_model."); save() writes the
  /// pair's two LoRA folders. No projections or feature heads (ConfigError otherwise).
  static StudentParts pair(WanDiT high, WanDiT low, const PartsSetup& setup);

  /// Forward + loss + backward of `scale`·loss for one received batch; gradients accumulate
  /// into the fp32 master parameters (call zero_grad() before the first micro-batch).
  MicroLosses micro_step(const comm::TensorDict& batch, double scale, const CheckpointPolicy& policy);
  /// The loss weights of `batch`'s frames (frame_loss_weights on its t and x_t, the student's
  /// patch): undefined unless t is per token.
  torch::Tensor frame_weights(const comm::TensorDict& batch) const;
  /// The student's prediction in the teacher's output space (evaluation; no grad).
  torch::Tensor predict(const comm::TensorDict& batch);
  /// The prediction with its graph, for a loss of the caller's (train.objective dmd); pass the
  /// loss to backward().
  torch::Tensor forward_train(const comm::TensorDict& batch, const CheckpointPolicy& policy);
  /// Backward of `loss` (already scaled), gradients accumulated into the fp32 master parameters.
  void backward(const torch::Tensor& loss);
  /// The realism classifier's logit per sample [B] (setup.gan), with its graph: the hidden states
  /// after block gan_block, averaged over the tokens, layer-normalised (no affine), then
  /// Linear(dim, dim), SiLU, Linear(dim, 1) (the trainable "gan_in" and "gan_out" heads).
  torch::Tensor realism(const comm::TensorDict& batch, const CheckpointPolicy& policy);

  /// The fp32 tensors the optimizer and the gradient all-reduce see (fixed after start-up).
  const std::vector<torch::Tensor>& trainable() const { return trainable_; }
  /// A stable name for each trainable() tensor, same order: the DiT's own parameter names and
  /// "distill_heads.<head>.<weight|bias>" for projections and feature heads.
  const std::vector<std::string>& trainable_names() const { return trainable_names_; }
  /// For each trainable() tensor, the tensor the backward gives its gradient to: the bf16 compute
  /// copy under bf16-mixed (folded into the master's .grad by backward()), else itself.
  std::vector<torch::Tensor> grad_sources() const;
  /// For each DiT block, the indices into trainable() of its parameters (student.shard parameters).
  std::vector<std::vector<std::size_t>> block_units() const;
  /// student.shard parameters: every forward enters the blocks through `gate` (its owner outlives
  /// these parts' use), and every backward ends with gate->rest().
  void set_gate(BlockGate* gate) { gate_ = gate; }
  /// Zeroes every trainable gradient that exists (one multi-tensor kernel where LibTorch has it).
  void zero_grad();
  /// Where every part lives and trains (student.device).
  const c10::Device& device() const { return setup_.device; }
  /// After optimizer.step(): refresh the bf16 compute copy from the master weights in place.
  void after_optimizer_step();

  /// Number of modules and parameter tensors (tests check they never change after step 0).
  std::size_t module_count() const;
  std::size_t parameter_count() const;

  /// student.sequence_parallel's group (PartsSetup::sequence_parallel), or null.
  TokenHeadExchange* sequence_parallel() const { return setup_.sequence_parallel; }
  /// The DiT (a LoRA pair: the high-noise expert's).
  WanDiT& model() { return model_; }
  /// A LoRA pair (StudentParts::pair): two experts, both trained.
  bool is_pair() const { return !low_.is_empty(); }
  /// Every DiT the parts hold: the model, and a pair's low-noise expert.
  std::vector<WanDiT> models() const;
  /// Writes the DiT as a Wan checkpoint into `dir` (a LoRA student: a LoRA folder, lora.json and
  /// adapters.safetensors over setup.lora_base; a pair: its high_noise_model/ and low_noise_model/
  /// LoRA folders, what sample, evaluate and convert read as a pair), plus `distill_heads/heads.safetensors`
  /// holding the projections and feature heads when there are any.
  void save(const std::string& dir) const;

 private:
  StudentParts(WanDiT model, WanDiT low, const PartsSetup& setup);
  /// Registers `dit`'s trainable parameters under `prefix` + their names.
  void add_trainable(WanDiT& dit, const std::string& prefix);
  /// A pair's forward: each expert on its own samples, the outputs merged in batch order (with
  /// `tokens`, under sequence parallelism: each sample's head rows of this rank's tokens).
  torch::Tensor forward_pair(const WanInputs& in, const CheckpointPolicy& policy, bool tokens = false);
  /// The DiT's inputs of a batch (its device checked), under the parts' sequence parallelism.
  WanInputs inputs_of(const comm::TensorDict& batch);
  /// Student forward with hidden states captured after the blocks named by feature pairs.
  torch::Tensor forward(WanDiT& dit, const comm::TensorDict& batch, const CheckpointPolicy& policy,
                        std::map<std::int64_t, torch::Tensor>* hidden);
  /// micro_step's loss under sequence parallelism: this rank's rows against the target's.
  torch::Tensor token_loss(const comm::TensorDict& batch, const CheckpointPolicy& policy);
  /// The mean over a sample's tokens of `hidden` [B, L, dim] (blocks' states of the batch whose
  /// latent is `x_t`): under sequence parallelism, over the group's real tokens.
  torch::Tensor pool_tokens(const torch::Tensor& hidden, const torch::Tensor& x_t) const;
  torch::Tensor project_in(const torch::Tensor& x_t);
  torch::Tensor project_out(const torch::Tensor& y);

  PartsSetup setup_;
  WanDiT model_;    ///< fp32 master
  WanDiT compute_;  ///< bf16 copy (mixed precision) or the same module as model_
  WanDiT low_{nullptr};  ///< a LoRA pair's low-noise expert (model_ is the high one)
  std::int64_t gan_block_ = -1;  ///< the realism classifier's block (setup.gan), else -1
  BlockGate* gate_ = nullptr;    ///< student.shard parameters
  torch::nn::ModuleDict heads_;  ///< in_proj / out_proj / feature heads
  std::vector<torch::Tensor> trainable_;
  std::vector<std::string> trainable_names_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> master_compute_;  ///< mixed precision pairs
};

}  // namespace wd::student
