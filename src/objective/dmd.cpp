// train.objective dmd: distribution matching (DMD2). The student samples in student.steps, a
// critic learns its samples, the teacher answers the guided score at them; its keys are
// student::DmdConfig (critic.*, train.dmd_*, the GAN terms).
#include <spdlog/spdlog.h>

#include <algorithm>

#include "objective/builtin.hpp"
#include "objective/dmd.hpp"
#include "teacher/trajectory.hpp"

namespace wd::objective {

namespace {

class Dmd final : public ObjectiveSpec {
 public:
  Dmd()
      : ObjectiveSpec("dmd",
                      "distribution matching: the student samples in student.steps, a critic learns the student's "
                      "samples, the teacher answers the guided score at them",
                      own_traits()) {}

  void check(const Keys& k, ConfigProblems& p) const override {
    k.dmd.check_objective(true, name(), k.train.grad_accum, p);
    if (trajectory_stream(k)) trajectory_spec(k).validate(p);
    p.check(!k.dmd.critic_dims() || (k.dmd.critic_lora_rank <= 0 && k.student.lora_rank <= 0),
            "critic.dim, ffn_dim, num_heads and num_layers size a full critic; a LoRA critic (critic.lora_rank, or a "
            "LoRA student's) is the teacher's architecture: leave them at 0");
  }
  void check_unused(const Keys& k, const std::string& active, ConfigProblems& p) const override {
    k.dmd.check_objective(false, active, k.train.grad_accum, p);
  }
  void log_teacher(const Keys& k, const data::TimestepRange& range, bool colocated) const override {
    ObjectiveSpec::log_teacher(k, range, colocated);
    const auto& dmd = k.dmd;
    spdlog::info("train.objective dmd: the generator samples in {} Euler steps (train.dmd_start {}); {} critic "
                 "updates per generator update; {} answers each update's real-score request",
                 k.student.steps, name_of(dmd.start), dmd.critic_ratio,
                 colocated ? "each student's own teacher" : "the replica's teacher rank");
    if (dmd.gan()) {
      spdlog::info("dmd GAN term (DMD2): the critic's realism classifier after {} block learns the stream's x_t (real) "
                   "from the generator's samples noised to the same t (fake), weight {:g}; the generator's GAN loss "
                   "weight {:g}",
                   dmd.critic_gan_block < 0 ? std::string("its last") : "its " + std::to_string(dmd.critic_gan_block),
                   dmd.critic_gan_weight, dmd.gan_weight);
    }
    if (!train_targets(k)) {
      spdlog::info("train.objective dmd without a regression term: training batches carry the data alone (no teacher "
                   "forward); the teacher's forwards go to the held-out batches and the real-score requests");
    }
  }
  /// With a regression term the stream carries the teacher's trajectories; without, the data alone.
  bool trajectory_stream(const Keys& k) const override { return k.dmd.regression_weight > 0; }
  bool train_targets(const Keys& k) const override { return trajectory_stream(k); }
  /// A cache holds the regression term's trajectories; the real score asks a live teacher.
  std::string uncached(const Keys& k) const override {
    if (train_targets(k)) return "";
    return " and train.dmd_regression_weight" + config_value(k.dmd.regression_weight) +
           ": without the regression term its training batches carry the data alone and its real score needs a "
           "live teacher, so a cache saves no teacher forward of training; set train.dmd_regression_weight > 0 (the cache "
           "holds the regression term's trajectories, a teacher rank answers the real score), or train without "
           "data.teacher_cache";
  }
  /// One request of a sample every train.critic_ratio steps (a generator update).
  double requests(const Keys& k) const override { return 1.0 / ratio(k); }
  /// The generator's k jumps (1 from data) every step and its update every R-th (k + 2 forwards:
  /// jumps, the critic's fake score and the backward); the critic's update (3, a fake sample's
  /// forward each R-th); DMD2's GAN term: the classifier's forward and backward of real and fake
  /// every critic update (2 samples a sample, a backward counted as 2 forwards), the generator's
  /// term every R-th. Less the 3 of a training step, counted already.
  double student_extra_forwards(const Keys& k, double critic_cost) const override {
    const double jumps = k.dmd.simulate() ? static_cast<double>(k.student.steps) : 1.0;
    const double r = ratio(k);
    const double gan = (k.dmd.gan() ? 6.0 : 0.0) + (k.dmd.gan_weight > 0 ? 3.0 / r : 0.0);
    const double generator = jumps + (jumps + 2.0) / r;
    const double critic = 3.0 + 1.0 / r + gan;
    return generator + critic_cost * critic - 3.0;
  }

 private:
  static double ratio(const Keys& k) { return static_cast<double>(std::max<std::int64_t>(1, k.dmd.critic_ratio)); }
  static Traits own_traits() {
    Traits t;
    t.whole_teacher = "'s teacher answers the real score with the conditional and negative forwards of the whole "
                      "teacher on one rank";
    t.guidance = Guidance::kUnlessOne;
    t.few_step = true;
    t.real_score = true;
    t.samples_teacher_latents = true;
    return t;
  }
};

}  // namespace

std::unique_ptr<ObjectiveSpec> make_dmd() { return std::make_unique<Dmd>(); }

WanConfig critic_model_config(const Keys& k, const WanConfig& teacher_model) {
  const auto& dmd = k.dmd;
  auto c = k.student.model_config(teacher_model);
  if (dmd.critic_init == CriticInit::kTeacher) {
    c.dim = teacher_model.dim;
    c.ffn_dim = teacher_model.ffn_dim;
    c.num_heads = teacher_model.num_heads;
    c.num_layers = teacher_model.num_layers;
  }
  if (dmd.critic_dim) c.dim = dmd.critic_dim;
  if (dmd.critic_ffn_dim) c.ffn_dim = dmd.critic_ffn_dim;
  if (dmd.critic_num_heads) c.num_heads = dmd.critic_num_heads;
  if (dmd.critic_num_layers) c.num_layers = dmd.critic_num_layers;
  return c;
}

LoraSpec critic_lora(const Keys& k, std::int64_t num_layers) {
  const bool critic = find(k.train.objective).traits().real_score;
  if (!critic || (k.dmd.critic_lora_rank <= 0 && k.student.lora_rank <= 0)) return {};
  return k.student.lora_spec(num_layers, k.dmd.critic_lora_rank);
}

}  // namespace wd::objective
