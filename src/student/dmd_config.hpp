// DmdConfig: train.objective dmd's own keys (the critic.* and train.dmd_* keys, the GAN terms),
// bound and checked by the dmd spec of the objective table (objective/dmd.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "core/choices.hpp"
#include "core/config.hpp"

namespace wd::student {

struct DmdConfig {
  /// where the generator's training sample starts: simulate (its own student.steps Euler jumps
  /// from noise, gradient through the last) | data (one jump from the stream's noised data)
  DmdStart start = DmdStart::kSimulate;
  /// critic updates per generator update (train.steps counts critic updates)
  std::int64_t critic_ratio = 5;
  /// the range of u in the re-noising σ = shift(u) (shift: teacher.shift), as DMD2's 2%..98%
  double t_min = 0.02;
  double t_max = 0.98;
  /// the critic's learning rate (same warmup/cosine shape as train.lr); 0 = train.lr
  double critic_lr = 0.0;
  /// student (the critic starts as a copy of the generator's initial weights) | teacher (the
  /// teacher's architecture, every tensor of it) | random
  CriticInit critic_init = CriticInit::kStudent;
  /// the critic's dims; 0 = the student's (critic.init random when any is set)
  std::int64_t critic_dim = 0, critic_ffn_dim = 0, critic_num_heads = 0, critic_num_layers = 0;
  /// r > 0 makes the critic rank-r adapters over the teacher's frozen base (shared with a LoRA
  /// student's); 0 = the student's kind (a LoRA student's rank, else a full DiT)
  std::int64_t critic_lora_rank = 0;
  /// weight of a regression to the teacher's trajectories (the `trajectory` target of the
  /// stream's batch) added to the generator's loss; > 0 makes the stream the trajectory stream
  double regression_weight = 0.0;
  /// DMD2's GAN term: the critic's realism classifier (a head on its hidden states after block
  /// critic.gan_block) learns real (the stream's noised samples) from fake (the generator's
  /// samples noised alike) with this weight on its loss; 0 = no classifier
  double critic_gan_weight = 0.0;
  /// the critic block whose output the classifier reads; -1 = the last
  std::int64_t critic_gan_block = -1;
  /// weight of the generator's non-saturating GAN loss softplus(−D(fake)) (needs
  /// critic.gan_weight > 0)
  double gan_weight = 0.0;

  /// Whether any critic dim is set.
  bool critic_dims() const { return critic_dim || critic_ffn_dim || critic_num_heads || critic_num_layers; }
  /// Whether the critic carries the realism classifier (its weight is 0 unless the objective is dmd).
  bool gan() const { return critic_gan_weight > 0; }
  /// Whether the generator's sample is its own student.steps jumps from noise (train.dmd_start).
  bool simulate() const { return start == DmdStart::kSimulate; }
  /// The critic's learning rate at `step`: `lr_at_step` (train.lr's schedule at that step)
  /// scaled to critic.lr over `lr` (train.lr).
  double critic_lr_at(double lr_at_step, double lr) const { return lr_at_step * (critic_lr > 0 ? critic_lr / lr : 1.0); }

  void bind(OptionTable& t);
  /// Every key's own range, for any objective.
  void validate(ConfigProblems& p) const;
  /// The keys against the objective: with another objective (`active` false, named `objective`)
  /// every weight and critic dim must be 0; dmd's own limits when active.
  void check_objective(bool active, const std::string& objective, std::int64_t grad_accum, ConfigProblems& p) const;
};

}  // namespace wd::student
