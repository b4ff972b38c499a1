// The models a student rank trains (a full student, a LoRA student over the teacher's frozen base,
// a LoRA pair) and their gradient reduction over the student group (student.shard's slices).
#include <spdlog/spdlog.h>

#include <map>

#include "comm/mpi_check.hpp"
#include "comm/shard_collectives.hpp"
#include "job/parts_setup.hpp"
#include "job/student_side.hpp"
#include "model/wan_lora.hpp"
#include "student/student_model.hpp"

namespace wd::job {

std::uint64_t init_seed(const RunConfig& cfg, bool critic, std::optional<std::size_t> expert) {
  constexpr std::uint64_t kCriticSalt = 0xC817ULL;
  constexpr std::uint64_t kLowExpertSalt = 0x10E5ULL;
  auto seed = cfg.train.seed;
  if (critic) seed ^= kCriticSalt;
  if (expert == WanExperts::kLow) seed ^= kLowExpertSalt;
  return seed;
}

namespace {

/// teacher.placement colocated: each base tensor that this rank's own teacher holds in the same
/// dtype and shape (the base's expert's: `expert`, a pair's, or student.expert's) is bound to the
/// teacher's, so teacher, student and a LoRA critic (bound to the student's) hold one copy on the
/// device. Returns how many were bound.
std::size_t share_with_teacher(const TrainJob& job, WanDiTImpl& base, const teacher::TeacherStage& stage,
                               std::optional<std::size_t> expert) {
  // Its index among the teacher's experts, or the only one the teacher loaded.
  if (!expert && !job.cfg.student.expert.empty()) expert = expert_index(job.cfg.student.expert);
  const auto& teacher = stage.experts().at(stage.experts().size() == 2 && expert ? *expert : 0);
  if (teacher.streamer) return 0;  // its blocks are copied in per use: nothing resident to share
  std::map<std::string, torch::Tensor> held;
  for (const auto& p : teacher.model->named_parameters()) held[p.key()] = p.value();
  std::size_t bound = 0;
  for (const auto& p : base.named_parameters()) {
    const auto it = held.find(p.key());
    if (it == held.end() || it->second.scalar_type() != p.value().scalar_type() ||
        !it->second.sizes().equals(p.value().sizes())) {
      continue;
    }
    base.bind_parameter(p.key(), it->second);
    ++bound;
  }
  for (auto& p : base.parameters()) p.set_requires_grad(false);
  return bound;
}

/// student.lora_rank: the frozen base with fp32 adapters, loaded from student.lora_init when given;
/// with a colocated teacher (`own`), over the teacher's own tensors where they match. `expert`: a
/// LoRA pair's expert (its base, its own adapter seed, its half of a pair's student.lora_init).
WanDiT make_lora_student(const TrainJob& job, const teacher::TeacherStage* own,
                         std::optional<std::size_t> expert = std::nullopt) {
  const auto& cfg = job.cfg;
  auto model = load_frozen_base(job, "student.lora_rank", expert);
  const auto base_tensors = model->parameters().size();
  const auto shared = own ? share_with_teacher(job, *model, *own, expert) : 0;
  // The high expert's adapters draw as a single student's do; the low one's from another seed.
  model->add_lora(cfg.student.lora_spec(model->config().num_layers), init_seed(cfg, false, expert));
  const auto base = expert ? job.experts->expert(*expert).path() : job.student_base().path();
  std::string init = cfg.student.lora_init;
  if (!init.empty() && expert) {
    // A pair's adapters start from a pair (student.expert runs' folders, or an exported pair).
    init = read_lora_pair(init).at(*expert).dir;  // {low, high}: WanExperts' order
  }
  if (!init.empty()) load_lora_into(*model, read_lora_file(init, model->config()), init);
  if (job.world_rank() == job.layout.student_world_ranks().front()) {
    std::int64_t trainable = 0;
    for (const auto& [name, t] : model->lora_parameters()) trainable += t.numel();
    spdlog::info("LoRA student{}: rank {} alpha {} on {} linears ({} trainable parameters) over the frozen {} base of {}"
                 "{}{}",
                 expert ? fmt::format(" ({} expert of the pair)", *expert == WanExperts::kHigh ? "high" : "low") : "",
                 model->lora().rank, model->lora().alpha, model->lora().targets.size(), trainable,
                 dtype_name(model->dtype()), base, init.empty() ? "" : ", adapters from " + init,
                 own ? fmt::format("; {} of its {} tensors are the colocated teacher's own (one copy)", shared,
                                   base_tensors)
                     : "");
  }
  return model;
}

void log_shard(const TrainJob& job, const student::OptimizerShard& shard,
               std::int64_t padded, const char* what) {
  const auto& cfg = job.cfg;
  WD_CHECK_AS(ConfigError, !shard.views().empty(),
              "student.shard " << name_of(cfg.student.shard) << ": the student's " << padded << " parameters leave rank "
                               << job.world_rank() << " no slice among " << shard.group_size()
                               << " students; use student.shard none");
  if (job.world_rank() != job.layout.student_world_ranks().front()) return;
  const auto total = shard.parameter_count();
  spdlog::info("student.shard {}: each of {} students keeps AdamW moments{} for {} of {} parameters "
               "(the last slice {} padding) of {}",
               name_of(cfg.student.shard), shard.group_size(),
               shard.gate() ? ", gradients and weights" : shard.owns_gradients() ? " and gradients" : "",
               shard.slice_size(), total, padded - total, what);
  if (const auto* gate = shard.gate()) {
    spdlog::info("student.shard parameters: {} blocks gathered for each use (forward and recomputation); between "
                 "uses each student holds its slice and the {} parameters outside the blocks ({:.2f} MiB of {:.2f})",
                 gate->block_count(), gate->root_parameters(), shard.weight_bytes() / 1048576.0,
                 4.0 * static_cast<double>(total) / 1048576.0);
  }
}

}  // namespace

student::PartsSetup parts_setup(const TrainJob& job, const c10::Device& device) {
  const auto& cfg = job.cfg;
  auto setup = parts_setup(cfg, job.model.in_dim, job.plan.out_channels, job.model.dim, device);
  if (cfg.student.lora_rank > 0 && job.experts) setup.lora_base = job.student_base().path();  // flow: refused below
  if (job.lora_pair()) {
    setup.lora_base = job.experts->expert(WanExperts::kHigh).path();
    setup.lora_base_low = job.experts->expert(WanExperts::kLow).path();
    setup.router = [experts = &*job.experts](const torch::Tensor& t) { return experts->route(t); };
  }
  return setup;
}

WanDiT load_frozen_base(const TrainJob& job, const char* key, std::optional<std::size_t> expert) {
  WD_CHECK_AS(ConfigError, job.experts,
              key << " needs a teacher.checkpoint as its base (train.objective flow without a teacher has none)");
  const auto dtype = job.cfg.student.precision == Precision::kBf16Mixed ? std::optional<c10::ScalarType>(torch::kBFloat16)
                                                                : std::nullopt;
  auto model = load_wan_dit(expert ? job.experts->expert(*expert) : job.student_base(), dtype);
  for (auto& p : model->parameters()) p.set_requires_grad(false);
  return model;
}

student::StudentParts make_student_parts(const TrainJob& job, const c10::Device& device,
                                        const teacher::TeacherStage* own, TokenHeadExchange* sequence_parallel) {
  const auto& cfg = job.cfg;
  const auto& tc = job.model;
  auto setup = parts_setup(job, device);
  setup.sequence_parallel = sequence_parallel;
  if (!cfg.student.expert.empty() && job.world_rank() == job.layout.student_world_ranks().front()) {
    spdlog::info("student.expert {}: a student of the teacher's {} expert ({}), trained on {} only", cfg.student.expert,
                 cfg.student.expert, job.student_base().path(), job.student_range().describe());
  }
  if (job.lora_pair()) {
    if (job.world_rank() == job.layout.student_world_ranks().front()) {
      spdlog::info("LoRA pair: one adapter set per expert of {}, each trained on the samples the teacher routes to it "
                   "(t >= {:g}: high_noise_model, below: low_noise_model)",
                   job.experts->path(), job.experts->boundary_timestep());
    }
    auto high = make_lora_student(job, own, WanExperts::kHigh);
    return student::StudentParts::pair(std::move(high), make_lora_student(job, own, WanExperts::kLow), setup);
  }
  if (cfg.student.lora_rank > 0) return student::StudentParts(make_lora_student(job, own), setup);
  const auto sc = cfg.student.model_config(tc);
  // Without a teacher (flow) the student starts from random weights or student.init weights:PATH.
  return student::StudentParts(
      student::build_student(sc, cfg.student, job.experts ? &job.student_base() : nullptr, cfg.train.seed), setup);
}

Training make_training(const TrainJob& job, student::StudentParts& parts, const c10::Device& device,
                       RoleServices& services, double lr, const char* what) {
  const auto& cfg = job.cfg;
  const auto mode = cfg.student.shard;
  int students = 1;
  WD_CHECK_MPI(MPI_Comm_size(job.groups->students(), &students));
  Training r;
  const bool weights = mode == student::ShardMode::kParameters;
  WD_CHECK_AS(ConfigError, !weights || device.is_cpu(),
              "student.shard parameters runs on host students (MPI all-gathers from the backward); this student "
              "trains on " << device << ": set student.device cpu, or student.shard gradients");
  // ZeRO's reduce-scatter and all-gather: NCCL where the gradient all-reduce would be (GPU students
  // of distinct GPUs), MPI otherwise; parameters' gathers run on the host (MPI).
  const auto collectives = [&] {
    return comm::make_shard_collectives(job.groups->students(), device, cfg.comm.backend, cfg.comm.timeout_s,
                                        job.world_rank(), &services.health);
  };
  if ((mode == student::ShardMode::kGradients || weights) && students > 1) {
    r.shard = weights ? std::make_unique<student::OptimizerShard>(job.groups->students(), parts.trainable(),
                                                                  cfg.comm.bucket_bytes(), cfg.comm.timeout_s,
                                                                  job.world_rank(), &services.health,
                                                                  parts.block_units())
                      : std::make_unique<student::OptimizerShard>(job.groups->students(), parts.trainable(),
                                                                  cfg.comm.bucket_bytes(), cfg.comm.timeout_s,
                                                                  job.world_rank(), &services.health,
                                                                  parts.grad_sources(), collectives());
    parts.set_gate(r.shard->gate());
    r.reducer = std::make_unique<student::ShardReducer>(*r.shard, &services.health);
    if (job.world_rank() == job.layout.student_world_ranks().front()) {
      spdlog::info("gradient reduce-scatter: {} over {} students in {} buckets, started from the backward's "
                   "gradient hooks ({})",
                   r.shard->backend(), students, r.shard->scatter()->bucket_count(), what);
    }
    log_shard(job, *r.shard, r.shard->slice_size() * students, what);
  } else {
    r.reducer = comm::make_gradient_reducer(job.groups->students(), parts.trainable(), cfg.comm.bucket_bytes(),
                                            cfg.comm.timeout_s, job.world_rank(), device, cfg.comm.backend,
                                            &services.health);
    if (mode != student::ShardMode::kNone && r.reducer->whole_buffer().defined()) {
      r.shard = std::make_unique<student::OptimizerShard>(job.groups->students(), parts.trainable(),
                                                          r.reducer->whole_buffer(), cfg.comm.timeout_s,
                                                          job.world_rank(), &services.health, collectives());
      log_shard(job, *r.shard, r.reducer->whole_buffer().numel(), what);
    } else if (mode != student::ShardMode::kNone && job.world_rank() == job.layout.student_world_ranks().front()) {
      spdlog::info("student.shard {}: one student, nothing to split ({}'s optimizer stays whole)", name_of(cfg.student.shard),
                   what);
    }
  }
  if (services.faults.planned(FaultSpec::Point::kAllreduce)) {
    // The loop passes average() the 0-based step (dmd: every step reduces the critic's gradients,
    // the generator's only at its updates).
    r.reducer->set_fault_hook([&faults = services.faults, device](std::int64_t step) {
      faults.at(FaultSpec::Point::kAllreduce, step + 1, device);
    });
  }
  if (r.shard && services.faults.planned(FaultSpec::Point::kAllgather)) {
    r.shard->set_fault_hook([&faults = services.faults, device](std::int64_t step) {
      faults.at(FaultSpec::Point::kAllgather, step + 1, device);
    });
  }
  r.optimizer = std::make_unique<student::TrainOptimizer>(parts.trainable(),
                                                          student::TrainOptimizer::options(lr, cfg.train), r.shard.get());
  return r;
}

}  // namespace wd::job
