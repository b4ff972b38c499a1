// StudentConfig (`[student]`) and TrainConfig (`[train]`).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/choices.hpp"
#include "core/config.hpp"
#include "core/checkpoint_policy.hpp"
#include "model/wan_config.hpp"

namespace wd::student {

/// The student DiT, keyed with the Wan config names; 0 means "the teacher's value".
struct StudentConfig {
  std::int64_t dim = 64;
  std::int64_t ffn_dim = 128;
  std::int64_t num_heads = 4;
  std::int64_t num_layers = 2;
  std::int64_t in_dim = 0;
  /// A teacherless student's model type (t2v | i2v | ti2v); empty: the teacher's, or t2v.
  std::string model_type;
  std::int64_t out_dim = 0;
  std::int64_t freq_dim = 0;
  /// random | teacher-blocks:i,j,... (copy those teacher blocks; needs equal dims) | weights:PATH
  /// (every tensor from a checkpoint of the student's dims, e.g. an earlier run's RUN/student)
  std::string init = "random";
  /// off | all | every:k: blocks that recompute their activations in the backward, parsed at parse
  CheckpointPolicy checkpointing;
  /// fp32 | bf16-mixed (bf16 compute, fp32 master weights and optimizer state)
  Precision precision = Precision::kFp32;
  /// none | optimizer | gradients | parameters: what the student group splits between its ranks
  /// (optimizer_shard.hpp)
  ShardMode shard = ShardMode::kNone;
  /// fp32 matmuls on a CUDA student may use TF32 (false: exact fp32; no effect on the host)
  bool tf32 = true;
  DeviceChoice device = DeviceChoice::kAuto;  ///< student_device.hpp
  /// trained | frozen: the channel projections used when in/out channels differ from the teacher's
  Projection projection = Projection::kTrained;
  /// feature distillation pairs "s:t,s:t" (student block s matched to teacher block t); empty = off
  std::string features;
  double feature_weight = 0.1;  ///< weight of the feature loss next to the output loss
  /// train.objective trajectory: the student's sampling steps k (its schedule: teacher.shift)
  std::int64_t steps = 4;
  /// LoRA student (> 0): the teacher's architecture, its frozen base read from the teacher
  /// checkpoint, and trainable rank-r adapters on lora_targets; 0 = a full student
  std::int64_t lora_rank = 0;
  double lora_alpha = 0;  ///< adapter scale alpha / rank (0 = rank: scale 1)
  std::string lora_targets = "attn,ffn";  ///< model/wan_dit.hpp lora_target_linears
  std::string lora_init;  ///< a LoRA file or folder the adapters start from (empty: up = 0)
  /// Two-expert (A14B) teacher: "high" or "low" trains a student of that expert alone, on the
  /// timesteps the teacher routes to it, from that expert's weights (LoRA base, student.init
  /// teacher); empty = one student for every t (a LoRA student then needs a one-expert teacher)
  std::string expert;
  /// Sequence parallelism (Ulysses, docs/sequence-parallel.md): the N student ranks of a group
  /// share each sample, each holding 1/N of its tokens through every block; 1 = off
  std::int64_t sequence_parallel = 1;

  void bind(OptionTable& t);
  void validate(ConfigProblems& p) const;
  /// The student's WanConfig: the teacher's with this struct's fields applied.
  WanConfig model_config(const WanConfig& teacher) const;
  /// The adapters of a LoRA student over a base of `num_layers` blocks (rank 0: none), or with
  /// `rank` > 0 adapters of that rank on the same targets (alpha: lora_alpha, else the rank).
  LoraSpec lora_spec(std::int64_t num_layers, std::int64_t rank = 0) const;
  /// Teacher block indices of `teacher-blocks:...` (empty otherwise).
  std::vector<std::int64_t> teacher_blocks() const;
  /// The checkpoint of `weights:PATH` (empty otherwise).
  std::string init_weights() const;
  /// The (student block, teacher block) pairs of `features`.
  std::vector<std::pair<std::int64_t, std::int64_t>> feature_pairs() const;
};

struct TrainConfig {
  std::int64_t steps = 300;        ///< optimizer steps
  std::int64_t batch_size = 2;     ///< samples per student rank per micro-batch
  std::int64_t grad_accum = 1;     ///< micro-batches per optimizer step
  double lr = 2e-3;
  double min_lr = 1e-4;            ///< end of the cosine decay
  std::int64_t warmup_steps = 10;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double grad_clip = 1.0;          ///< max global grad norm; 0 = off
  double ema_decay = 0.0;          ///< weight average of the student (student/ holds it); 0 = off
  std::int64_t log_every = 10;
  std::int64_t eval_samples = 8;   ///< held-out samples (the last ones of the data set)
  std::int64_t eval_every = 0;     ///< 0 = evaluate at the start and the end only
  std::int64_t sample_every = 0;   ///< steps between sampling probes on student rank 0; 0 = off
  std::int64_t sample_steps = 20;  ///< UniPC steps of a probe
  double sample_shift = 12.0;      ///< σ shift of a probe's schedule
  double collapse_ratio = 0.1;     ///< a probe flags a channel whose std ratio falls below this
  std::uint64_t seed = 0;
  /// train.objective: the name of a spec in the objective table (objective/objective_spec.hpp),
  /// checked against the table when the options are parsed
  std::string objective = "velocity";
  double cond_dropout = 0.0;  ///< flow: fraction of training samples whose context is zeroed
  /// trajectory: fraction of each batch whose input state the student reaches by its own jumps
  /// from the trajectory's noise (target: the jump to the teacher's next state); 0 = off
  double trajectory_rollout = 0.0;
  /// Set by the objective (RunConfig::student_train), not keys: the sampling probe's solver
  /// (euler for students of student.steps jumps), and whether evaluations also report each of
  /// the student's sampling intervals (students of the teacher's trajectories).
  Solver sample_solver = Solver::kUnipc;
  bool interval_metrics = false;

  /// Binds every [train] key but train.objective, which the objective table binds (its names
  /// are the table's: objective/objective_spec.hpp).
  void bind(OptionTable& t);
  /// The problems of the keys every objective shares; an objective's own keys are checked by its
  /// spec.
  void validate(ConfigProblems& p) const;
  /// Learning rate at `step`: linear warmup from 0, then cosine from lr to min_lr.
  double lr_at(std::int64_t step) const;
};

}  // namespace wd::student
