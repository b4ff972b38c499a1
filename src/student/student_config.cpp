// Binding, validation and derived values of the student and training configs.
#include "student/student_config.hpp"

#include <cmath>
#include <sstream>
#include <utility>

#include "core/errors.hpp"
#include "student/checkpointing.hpp"
#include "student/optimizer_shard.hpp"

namespace wd::student {

void StudentConfig::bind(OptionTable& t) {
  t.bind("student.dim", dim, "student hidden size")
      .bind("student.ffn_dim", ffn_dim, "student FFN size")
      .bind("student.num_heads", num_heads, "student attention heads")
      .bind("student.num_layers", num_layers, "student blocks")
      .bind("student.in_dim", in_dim, "student input channels (0 = the teacher's)")
      .bind("student.model_type", model_type,
            "a student trained without a teacher (train.objective flow): t2v | i2v (takes the data set's image "
            "conditions as y: in_dim 2C + 4) | ti2v (per-token timesteps, its image mode from /condition); "
            "empty = t2v. A distilled student takes its teacher's")
      .bind("student.out_dim", out_dim, "student output channels (0 = the teacher's)")
      .bind("student.freq_dim", freq_dim, "student sinusoid size (0 = the teacher's)")
      .bind("student.init", init,
            "random | teacher-blocks:i,j,... (copy teacher blocks) | weights:PATH (every tensor from a "
            "checkpoint of the student's dims: an earlier run's RUN/student or a checkpoint's student, any layout "
            "`inspect` reads; e.g. a trajectory student for dmd)")
      .bind_parsed<CheckpointPolicy>("student.checkpointing", checkpointing, CheckpointPolicy::parse,
                                     [](const CheckpointPolicy& p) { return p.str(); },
            "off | all | every:k: blocks that keep only their inputs and recompute their "
            "activations in the backward (every:k = blocks 0, k, 2k, ...); less memory, more time")
      .bind("student.precision", precision, "bf16-mixed: bf16 compute, fp32 master weights")
      .bind("student.shard", shard,
            "none, or ZeRO-1 to 3: optimizer (ZeRO-1: each of N student ranks keeps the AdamW "
            "moments of 1/N of the parameters, updates that slice and all-gathers the result) | gradients (ZeRO-2: "
            "the gradients of that slice too, reduce-scattered bucket by bucket from the backward) | parameters "
            "(ZeRO-3: the blocks' weights too, each block all-gathered for its forward and its recomputation and let go "
            "after: host students, fp32, student.checkpointing all); checkpoints hold each rank's slice and "
            "resume on any student count")
      .bind("student.tf32", tf32,
            "on a CUDA student, fp32 matmuls may use TF32 tensor cores (about 8x the fp32 rate "
            "on Hopper, 10-bit mantissa inputs, fp32 accumulation); false keeps exact fp32. No "
            "effect on the host (docs/gpu-numerics.md)")
      .bind("student.device", device,
            "where each student trains. auto: a GPU when this build has CUDA "
            "and the rank sees one, else the host. A rank uses GPU <node-local rank mod GPUs on "
            "the node>, so ranks share a GPU (with a warning) only when a node has fewer GPUs "
            "than ranks")
      .bind("student.projection", projection,
            "the channel projections used when in/out channels differ from the teacher's: trained or frozen")
      .bind("student.features", features,
            "feature distillation pairs s:t,s:t (student block : teacher block); empty = off")
      .bind("student.feature_weight", feature_weight, "weight of the feature loss")
      .bind("student.steps", steps,
            "train.objective trajectory: the student's sampling steps k (Euler, teacher.shift's schedule)")
      .bind("student.lora_rank", lora_rank,
            "r > 0: a LoRA student: the teacher's architecture with its frozen base read from "
            "teacher.checkpoint (student.dim/ffn_dim/num_heads/num_layers/in_dim/out_dim are not used) and "
            "trainable rank-r adapters on student.lora_targets; RUN/student is then a LoRA folder "
            "(convert --layout lora exports it for diffusers and ComfyUI); over a two-expert (A14B) teacher "
            "without student.expert, a LoRA pair: one adapter set per expert, each trained on the samples "
            "routed to it, RUN/student/high_noise_model/ and low_noise_model/. 0 = a full student")
      .bind("student.lora_alpha", lora_alpha, "LoRA scale alpha / rank (0 = the rank: scale 1)")
      .bind("student.lora_targets", lora_targets,
            "the block linears that get adapters: a comma list of all, attn (both attentions' q,k,v,o), "
            "self_attn, cross_attn, ffn, q, k, v, o or in-block names (self_attn.q, ffn.0, ...)")
      .bind("student.lora_init", lora_init,
            "a LoRA to start the adapters from: a LoRA student folder, or a .safetensors in the diffusers "
            "(lora_A/lora_B), ComfyUI (lora_down/lora_up/alpha) or wan-distill layout, of rank "
            "student.lora_rank (a LoRA pair: a folder of two, high_noise_model/ and low_noise_model/); "
            "empty = up matrices zero (the student starts as the teacher)")
      .bind("student.expert", expert,
            "two-expert (A14B) teacher: high | low: the student learns that expert alone, on the timesteps the "
            "teacher routes to it (t >= teacher.boundary*1000 or below), from that expert's weights (the LoRA "
            "base, or student.init teacher-blocks); one job per expert, RUN/student holds that expert (docs/lora.md). "
            "Empty: one student for every t (a LoRA student: a pair, both experts' adapters in one job)")
      .bind("student.sequence_parallel", sequence_parallel,
            "N > 1: sequence parallelism (Ulysses): consecutive groups of N student ranks share each sample, each "
            "rank holding 1/N of its tokens through every block (all-to-alls around self-attention trade the token "
            "split for a head split), so activations per rank fall N-fold; N must divide the student's num_heads "
            "and the students of each teacher replica; train.batch_size is per group (docs/sequence-parallel.md). "
            "1 = off");
}

LoraSpec StudentConfig::lora_spec(std::int64_t num_layers, std::int64_t rank) const {
  LoraSpec spec;
  if (rank <= 0) rank = lora_rank;
  if (rank <= 0) return spec;
  spec.rank = rank;
  spec.alpha = lora_alpha > 0 ? lora_alpha : static_cast<double>(rank);
  spec.targets = lora_target_linears(lora_targets, num_layers);
  return spec;
}

void StudentConfig::validate(ConfigProblems& p) const {
  p.check(dim >= 1, "student.dim" + config_value(dim) + " must be >= 1");
  p.check(num_heads >= 1, "student.num_heads" + config_value(num_heads) + " must be >= 1");
  p.check(num_heads < 1 || dim % num_heads == 0,
          "student.dim" + config_value(dim) + " must be divisible by student.num_heads" + config_value(num_heads));
  p.check(num_layers >= 1, "student.num_layers" + config_value(num_layers) + " must be >= 1");
  p.check(ffn_dim >= 1, "student.ffn_dim" + config_value(ffn_dim) + " must be >= 1");
  p.check(in_dim >= 0 && out_dim >= 0 && freq_dim >= 0,
          "student.in_dim/out_dim/freq_dim must be >= 0 (0 = the teacher's)");
  p.check(model_type.empty() || model_type == "t2v" || model_type == "i2v" || model_type == "ti2v",
          "student.model_type(" + model_type + ") must be t2v, i2v or ti2v (or empty)");
  bool init_ok = init == "random" || !init_weights().empty();
  if (init.rfind("teacher-blocks:", 0) == 0) {
    try {
      init_ok = !teacher_blocks().empty();
    } catch (const std::exception&) {
      init_ok = false;
    }
  }
  p.check(init_ok, "student.init(" + init + ") must be random, teacher-blocks:i,j,... or weights:PATH");
  if (shard == ShardMode::kParameters) {
    // ZeRO-3 here: a block's weights are gathered for its forward and again for its recomputation
    // in the backward, over MPI from the thread that runs the backward (host students).
    p.check(checkpointing.mode == CheckpointPolicy::Mode::kAll,
            "student.shard parameters gathers a block's weights again for its backward, which recomputes it: it "
            "needs student.checkpointing all, not " + checkpointing.str());
    p.check(precision == Precision::kFp32, "student.shard parameters trains fp32 weights; student.precision(" +
                                               std::string(name_of(precision)) +
                                     ") is not built with it");
    p.check(lora_rank == 0, "student.shard parameters with a LoRA student (student.lora_rank " +
                                std::to_string(lora_rank) + "): the adapters are small, shard gradients instead");
    p.check(device != DeviceChoice::kCuda, "student.shard parameters runs on host students (MPI all-gathers from the backward); "
                              "student.device(cuda) students shard gradients (student.shard gradients)");
  }
  bool features_ok = true;
  try {
    for (const auto& [s, t] : feature_pairs()) features_ok = features_ok && s >= 0 && t >= 0;
  } catch (const std::exception&) {
    features_ok = false;
  }
  p.check(features_ok, "student.features(" + features + ") must be pairs s:t,s:t of block indices");
  p.check(feature_weight >= 0, "student.feature_weight" + config_value(feature_weight) + " must be >= 0");
  p.check(sequence_parallel >= 1,
          "student.sequence_parallel" + config_value(sequence_parallel) + " must be >= 1 (1 = off)");
  p.check(lora_rank >= 0, "student.lora_rank" + config_value(lora_rank) + " must be >= 0 (0 = a full student)");
  p.check(lora_alpha >= 0, "student.lora_alpha" + config_value(lora_alpha) + " must be >= 0 (0 = the rank)");
  try {
    lora_target_linears(lora_targets, 1);
  } catch (const ConfigError& e) {
    p.check(false, e.what());
  }
  p.check(expert.empty() || expert == "high" || expert == "low",
          "student.expert(" + expert + ") must be high, low or empty");
  p.check(lora_rank > 0 || lora_init.empty(),
          "student.lora_init(" + lora_init + ") needs student.lora_rank > 0 (adapters to load it into)");
  p.check(lora_rank == 0 || init == "random",
          "student.init(" + init + ") and student.lora_rank(" + std::to_string(lora_rank) +
              ") exclude each other: a LoRA student is the teacher itself plus adapters");
}

std::vector<std::int64_t> StudentConfig::teacher_blocks() const {
  std::vector<std::int64_t> out;
  const std::string prefix = "teacher-blocks:";
  if (init.rfind(prefix, 0) != 0) return out;
  std::stringstream ss(init.substr(prefix.size()));
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

std::string StudentConfig::init_weights() const {
  const std::string prefix = "weights:";
  return init.rfind(prefix, 0) == 0 ? init.substr(prefix.size()) : std::string();
}

std::vector<std::pair<std::int64_t, std::int64_t>> StudentConfig::feature_pairs() const {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  std::stringstream ss(features);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto colon = item.find(':');
    if (colon == std::string::npos) throw ConfigError("student.features(" + features + "): '" + item + "' is not s:t");
    out.emplace_back(std::stoll(item.substr(0, colon)), std::stoll(item.substr(colon + 1)));
  }
  return out;
}

WanConfig StudentConfig::model_config(const WanConfig& teacher) const {
  WanConfig c = teacher;
  if (lora_rank > 0) return c;  // a LoRA student is the teacher's architecture
  c.dim = dim;
  c.ffn_dim = ffn_dim;
  c.num_heads = num_heads;
  c.num_layers = num_layers;
  if (in_dim) c.in_dim = in_dim;
  if (out_dim) c.out_dim = out_dim;
  if (freq_dim) c.freq_dim = freq_dim;
  return c;
}

void TrainConfig::bind(OptionTable& t) {
  t.bind("train.steps", steps, "optimizer steps")
      .bind("train.batch_size", batch_size,
            "samples per student rank per micro-batch (under student.sequence_parallel: per group of ranks)")
      .bind("train.grad_accum", grad_accum, "micro-batches per optimizer step")
      .bind("train.lr", lr, "peak learning rate (AdamW)")
      .bind("train.min_lr", min_lr, "learning rate at the end of the cosine decay")
      .bind("train.warmup_steps", warmup_steps, "linear warmup steps")
      .bind("train.weight_decay", weight_decay, "AdamW weight decay")
      .bind("train.beta1", beta1, "AdamW beta1")
      .bind("train.beta2", beta2, "AdamW beta2")
      .bind("train.grad_clip", grad_clip, "max global gradient norm (0 = off)")
      .bind("train.ema_decay", ema_decay,
            "exponential moving average of the student's weights, updated every step (e.g. 0.999; 0 = off): "
            "RUN/student and each checkpoint's student/ hold the average, checkpoints keep the trained weights "
            "too (ema.safetensors beside trainable.safetensors)")
      .bind("train.log_every", log_every, "steps between progress lines")
      .bind("train.eval_samples", eval_samples,
            "held-out samples (the last of the data set) for the relative-MSE evaluation")
      .bind("train.eval_every", eval_every, "steps between evaluations (0 = start and end only)")
      .bind("train.sample_every", sample_every,
            "steps between sampling probes: student rank 0 samples its student (UniPC) with the contexts of "
            "the first held-out batch and flags a collapse against that batch's teacher outputs (0 = off)")
      .bind("train.sample_steps", sample_steps,
            "sampling steps of a probe (train.objective trajectory: student.steps, Euler)")
      .bind("train.sample_shift", sample_shift,
            "σ shift of a probe's schedule (as wan-distill sample --shift; train.objective trajectory: teacher.shift)")
      .bind("train.collapse_ratio", collapse_ratio,
            "a probe flags the student when a channel's std falls below this fraction of the teacher's")
      .bind("train.seed", seed, "seed of the data order, the noise and the student init")
      .bind("train.cond_dropout", cond_dropout,
            "flow: the fraction of training samples whose context is zeroed, so the model also learns "
            "the unconditional velocity that guidance needs (chosen per sample and step from train.seed)")
      .bind("train.trajectory_rollout", trajectory_rollout,
            "trajectory: the fraction of each batch (its first places; the deal is random) whose input is the "
            "state the student reaches by its own Euler jumps from the trajectory's noise instead of the "
            "teacher's state, and whose target is the jump from there to the teacher's next state: the student "
            "learns to return to the teacher's path from where its own steps put it (0 = off; docs/objectives.md)");
}

void TrainConfig::validate(ConfigProblems& p) const {
  p.check(steps >= 1, "train.steps" + config_value(steps) + " must be >= 1");
  p.check(batch_size >= 1, "train.batch_size" + config_value(batch_size) + " must be >= 1");
  p.check(grad_accum >= 1, "train.grad_accum" + config_value(grad_accum) + " must be >= 1");
  p.check(lr > 0, "train.lr" + config_value(lr) + " must be > 0");
  p.check(min_lr >= 0 && min_lr <= lr, "train.min_lr" + config_value(min_lr) + " must be in [0, train.lr" + config_value(lr) + "]");
  p.check(warmup_steps >= 0, "train.warmup_steps" + config_value(warmup_steps) + " must be >= 0");
  p.check(weight_decay >= 0, "train.weight_decay" + config_value(weight_decay) + " must be >= 0");
  p.check(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1,
          "train.beta1" + config_value(beta1) + " and train.beta2" + config_value(beta2) + " must be in [0, 1)");
  p.check(grad_clip >= 0, "train.grad_clip" + config_value(grad_clip) + " must be >= 0");
  p.check(ema_decay >= 0 && ema_decay < 1, "train.ema_decay" + config_value(ema_decay) + " must be in [0, 1) (0 = off)");
  p.check(log_every >= 1, "train.log_every" + config_value(log_every) + " must be >= 1");
  p.check(eval_samples >= 0, "train.eval_samples" + config_value(eval_samples) + " must be >= 0");
  p.check(eval_every >= 0, "train.eval_every" + config_value(eval_every) + " must be >= 0");
  p.check(sample_every >= 0, "train.sample_every" + config_value(sample_every) + " must be >= 0");
  p.check(sample_steps >= 1, "train.sample_steps" + config_value(sample_steps) + " must be >= 1");
  p.check(sample_shift > 0, "train.sample_shift" + config_value(sample_shift) + " must be > 0");
  p.check(collapse_ratio > 0 && collapse_ratio < 1, "train.collapse_ratio" + config_value(collapse_ratio) + " must be in (0, 1)");
  p.check(cond_dropout >= 0 && cond_dropout < 1, "train.cond_dropout" + config_value(cond_dropout) + " must be in [0, 1)");
  p.check(trajectory_rollout >= 0 && trajectory_rollout <= 1,
          "train.trajectory_rollout" + config_value(trajectory_rollout) + " must be in [0, 1]");
  p.check(sample_every == 0 || eval_samples > 0,
          "train.sample_every" + config_value(sample_every) + " needs held-out samples: train.eval_samples" + config_value(eval_samples));
}

double TrainConfig::lr_at(std::int64_t step) const {
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps + 1);
  const auto decay = std::max<std::int64_t>(1, steps - warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / decay);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace wd::student
