// dmd on a student rank: the critic (a full DiT, or adapters over the teacher's base), its
// optimizer and reducer, the real score's channel, and the trainer.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "core/sequence_groups.hpp"
#include "job/plan_input.hpp"
#include "job/student_side.hpp"
#include "objective/dmd.hpp"
#include "student/student_model.hpp"

namespace wd::job {

namespace {

/// A LoRA critic over `base`'s frozen tensors (bound: one copy for both), with its own adapters.
WanDiT lora_over(const TrainJob& job, const WanDiT& base, std::uint64_t seed) {
  WanDiT critic(base->config(), WanInit::kEmpty, base->dtype());
  for (const auto& p : base->named_parameters()) {
    if (!WanDiTImpl::is_lora_name(p.key())) critic->bind_parameter(p.key(), p.value());
  }
  for (auto& p : critic->parameters()) p.set_requires_grad(false);
  critic->add_lora(objective::critic_lora(job.cfg.keys(), job.model.num_layers), seed);
  return critic;
}

/// The critic DiT of `sc` (objective::critic_model_config): critic.init student starts it as the
/// generator starts, teacher as the teacher (every block of student.expert's model), random from
/// its own seed.
WanDiT build_critic(const TrainJob& job, const WanConfig& sc) {
  const auto& cfg = job.cfg;
  if (cfg.dmd.critic_init == CriticInit::kRandom) return WanDiT(sc, WanInit::kRandom, torch::kFloat, init_seed(cfg, true));
  auto init = cfg.student;
  if (cfg.dmd.critic_init == CriticInit::kTeacher) {
    // sc has the teacher's dims (critic_model_config; critic.* dims are refused with it), which
    // build_student checks again against the blocks it copies.
    std::string blocks;
    for (std::int64_t b = 0; b < sc.num_layers; ++b) {
      blocks += (b ? "," : "") + std::to_string(b);
    }
    init.init = "teacher-blocks:" + blocks;
  }
  return student::build_student(sc, init, &job.student_base(), cfg.train.seed, "dmd critic");
}

/// A LoRA critic: adapters over the teacher's base, bound to the tensors of a LoRA generator's
/// base (one copy for both) or read from the teacher checkpoint as a LoRA student's is.
WanDiT make_lora_critic(const TrainJob& job, student::StudentParts& generator) {
  const auto seed = init_seed(job.cfg, true);
  if (generator.model()->lora().rank > 0) return lora_over(job, generator.model(), seed);
  auto critic = load_frozen_base(job, "critic.lora_rank");
  critic->add_lora(objective::critic_lora(job.cfg.keys(), job.model.num_layers), seed);
  return critic;
}

student::StudentParts make_critic_parts(const TrainJob& job, const c10::Device& device,
                                        student::StudentParts& generator) {
  const auto& cfg = job.cfg;
  auto setup = parts_setup(job, device);
  setup.feature_pairs.clear();  // the critic matches no teacher features
  setup.sequence_parallel = generator.sequence_parallel();  // its tokens split as the generator's
  setup.gan = cfg.dmd.gan();
  setup.gan_block = cfg.dmd.critic_gan_block;
  const bool lora = objective::critic_lora(cfg.keys(), job.model.num_layers).rank > 0;
  if (lora && generator.is_pair()) {
    // A pair's critic is a pair too: adapters over each expert's base, routed as the generator.
    const auto models = generator.models();  // {high, low}
    return student::StudentParts::pair(lora_over(job, models[0], init_seed(cfg, true, WanExperts::kHigh)),
                                       lora_over(job, models[1], init_seed(cfg, true, WanExperts::kLow)), setup);
  }
  if (lora) {
    setup.lora_base = job.student_base().path();
    return student::StudentParts(make_lora_critic(job, generator), setup);
  }
  const auto sc = objective::critic_model_config(cfg.keys(), job.model);
  if (cfg.dmd.critic_dims() && job.world_rank() == job.layout.student_world_ranks().front()) {
    spdlog::info("dmd critic of its own dims: dim {}, ffn {}, {} heads, {} blocks ({} parameters; the student's: {})",
                 sc.dim, sc.ffn_dim, sc.num_heads, sc.num_layers, wan_param_count(sc),
                 wan_param_count(cfg.student.model_config(job.model)));
  }
  return student::StudentParts(build_critic(job, sc), setup);
}

}  // namespace

void open_service(DmdSide& side, const TrainJob& job, const c10::Device& device, RoleServices& services) {
  side.service = comm::student_service(*job.groups, job.world_rank(), job.plan, service_schedule(job.cfg, job.plan),
                                       job.cfg.comm, device, &services.health);
  side.score = std::make_unique<student::RemoteScore>(*side.service->requests, *side.service->answers);
}

void make_dmd_trainer(DmdSide& side, const TrainJob& job, student::StudentParts& generator, const c10::Device& device,
                      int group_rank, const std::vector<int>& peers, RoleServices& services) {
  const auto& cfg = job.cfg;
  side.train = cfg.student_train();
  side.critic = std::make_unique<student::StudentParts>(make_critic_parts(job, device, generator));
  const auto sequence_parallel = std::max<std::int64_t>(1, cfg.student.sequence_parallel);
  const auto& train = cfg.train;
  // The critic shards as the student does (the same code: a trainable model and its optimizer).
  side.training = make_training(job, *side.critic, device, services,
                                cfg.dmd.critic_lr > 0 ? cfg.dmd.critic_lr : train.lr, "the dmd critic");
  services.memory.model.weights_bytes +=
      student::kept_weight_bytes(side.critic->trainable(), side.training.optimizer->shard());
  student::DmdParts parts{generator,
                          *side.critic,
                          *side.training.optimizer,
                          side.training.reducer.get(),
                          *side.score,
                          // A sequence-parallel group's ranks draw as one student: the group's index.
                          student::DmdSpec::from(cfg.student_train(), cfg.dmd, job.plan.latent,
                                                 SequenceGroups{static_cast<int>(sequence_parallel)}.group_of(group_rank)),
                          service_schedule(cfg, job.plan),
                          side.train,
                          cfg.dmd,
                          cfg.student.checkpointing,
                          job.world_rank(),
                          job.groups->students(),
                          cfg.comm.timeout_s,
                          peers,
                          &services.health,
                          static_cast<int>(sequence_parallel)};
  side.trainer = std::make_unique<student::DmdTrainer>(std::move(parts));
  side.method = std::make_unique<student::DmdMethod>(*side.trainer, *side.score, side.train, group_rank == 0);
}

}  // namespace wd::job
