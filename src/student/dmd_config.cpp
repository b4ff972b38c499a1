// Binding and checks of train.objective dmd's keys.
#include "student/dmd_config.hpp"

#include <array>
#include <sstream>
#include <utility>

namespace wd::student {
namespace {

/// The critic's own dims, each with its key: 0 means the student's.
std::array<std::pair<std::string, std::int64_t>, 4> critic_dim_keys(const DmdConfig& c) {
  return {{{"critic.dim", c.critic_dim},
           {"critic.ffn_dim", c.critic_ffn_dim},
           {"critic.num_heads", c.critic_num_heads},
           {"critic.num_layers", c.critic_num_layers}}};
}

}  // namespace

void DmdConfig::bind(OptionTable& t) {
  t.bind("train.dmd_start", start,
            "dmd: simulate (the generator's sample is its own student.steps Euler jumps from seeded noise, the "
            "gradient through the last jump) | data (one jump from the stream's noised data)")
      .bind("train.critic_ratio", critic_ratio,
            "dmd: critic updates per generator update; train.steps counts critic updates and the generator "
            "updates after every critic_ratio-th")
      .bind("train.dmd_t_min", t_min, "dmd: lower end of u, the re-noised sample's σ = shift(u) (teacher.shift)")
      .bind("train.dmd_t_max", t_max, "dmd: upper end of u (see train.dmd_t_min)")
      .bind("train.dmd_regression_weight", regression_weight,
            "dmd: weight of a regression to the teacher's trajectories added to the generator's loss (the "
            "trajectory objective's jump target on the stream's batch; the teacher then samples trajectories "
            "with teacher.steps); 0 = pure distribution matching")
      .bind("critic.gan_weight", critic_gan_weight,
            "dmd: > 0 gives the critic DMD2's realism classifier (a head on its hidden states after "
            "critic.gan_block) trained to tell the stream's noised samples (real) from the generator's samples "
            "noised to the same t (fake), its loss softplus(D(fake)) + softplus(-D(real)) added with this weight; "
            "0 = none")
      .bind("critic.gan_block", critic_gan_block, "dmd: the critic block whose output the classifier reads (-1 = the last)")
      .bind("train.gan_weight", gan_weight,
            "dmd: weight of the generator's GAN loss softplus(-D(its sample noised to the batch's t)) (needs "
            "critic.gan_weight > 0); 0 = none")
      .bind("critic.lr", critic_lr, "dmd: the critic's AdamW learning rate, train.lr's warmup and cosine (0 = train.lr)")
      .bind("critic.init", critic_init,
            "dmd: student (the critic starts as the generator's initial weights, dims = the student's) | teacher "
            "(the critic is the teacher's architecture and starts as the teacher, the real score, as DMD2's fake "
            "score does: the one to pair with a generator from student.init weights:PATH) | random")
      .bind("critic.dim", critic_dim,
            "dmd: the critic's hidden width (0 = the student's, the teacher's with critic.init teacher; needs "
            "critic.init random)")
      .bind("critic.ffn_dim", critic_ffn_dim, "dmd: the critic's FFN width (0 = the student's)")
      .bind("critic.num_heads", critic_num_heads, "dmd: the critic's attention heads (0 = the student's)")
      .bind("critic.num_layers", critic_num_layers, "dmd: the critic's blocks (0 = the student's)")
      .bind("critic.lora_rank", critic_lora_rank,
            "dmd: r > 0: the critic is rank-r adapters (student.lora_alpha, student.lora_targets) over the "
            "teacher's frozen base, shared with a LoRA student's, starting as the teacher (the real score); "
            "0 = a LoRA student's rank, else a full DiT of the student's dims");
}

void DmdConfig::validate(ConfigProblems& p) const {
  p.check(critic_ratio >= 1, "train.critic_ratio" + config_value(static_cast<double>(critic_ratio)) + " must be >= 1");
  p.check(t_min > 0 && t_min < t_max && t_max < 1,
          "train.dmd_t_min" + config_value(t_min) + " and train.dmd_t_max" + config_value(t_max) + " must satisfy 0 < min < max < 1");
  p.check(critic_lr >= 0, "critic.lr" + config_value(critic_lr) + " must be >= 0 (0 = train.lr)");
  p.check(critic_lora_rank >= 0, "critic.lora_rank" + config_value(static_cast<double>(critic_lora_rank)) + " must be >= 0");
  p.check(regression_weight >= 0, "train.dmd_regression_weight" + config_value(regression_weight) + " must be >= 0");
  p.check(critic_gan_weight >= 0, "critic.gan_weight" + config_value(critic_gan_weight) + " must be >= 0");
  p.check(gan_weight >= 0, "train.gan_weight" + config_value(gan_weight) + " must be >= 0");
  p.check(gan_weight == 0 || critic_gan_weight > 0,
          "train.gan_weight" + config_value(gan_weight) + " needs the critic's classifier: set critic.gan_weight > 0 (DMD2: 1e-2 "
          "for the critic, 3e-3 for the generator)");
  for (const auto& [key, value] : critic_dim_keys(*this)) {
    p.check(value >= 0, key + config_value(static_cast<double>(value)) + " must be >= 0 (0 = the student's)");
  }
  p.check(critic_gan_block >= -1, "critic.gan_block" + config_value(static_cast<double>(critic_gan_block)) +
                                      " must be a critic block index, or -1 for the last");
}

void DmdConfig::check_objective(bool active, const std::string& objective, std::int64_t grad_accum,
                                ConfigProblems& p) const {
  if (!active) {
    p.check(regression_weight == 0, "train.dmd_regression_weight" + config_value(regression_weight) +
                                        " weighs a term of the dmd generator loss: it needs train.objective dmd, not " +
                                        objective);
    for (const auto& [key, weight] : {std::pair<std::string, double>{"critic.gan_weight", critic_gan_weight},
                                       {"train.gan_weight", gan_weight}}) {
      p.check(weight == 0, key + config_value(weight) + " weighs a term of train.objective dmd's losses, not " + objective);
    }
    for (const auto& [key, value] : critic_dim_keys(*this)) {
      p.check(value == 0, key + config_value(static_cast<double>(value)) + " sizes train.objective dmd's critic, not " + objective);
    }
    return;
  }
  p.check(!critic_dims() || critic_init == CriticInit::kRandom,
          "critic.dim, ffn_dim, num_heads and num_layers give the critic its own dims, but critic.init(" +
              std::string(name_of(critic_init)) + ") starts it as the " +
              (critic_init == CriticInit::kTeacher ? "teacher, with the teacher's" : "generator starts, with the student's") +
              " dims: set critic.init random, or leave the critic's dims at 0");
  p.check(grad_accum == 1, "train.objective dmd takes one micro-batch a step: train.grad_accum" +
                               config_value(static_cast<double>(grad_accum)) + " must be 1");
}

}  // namespace wd::student
