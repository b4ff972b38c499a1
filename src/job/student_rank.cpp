// run_student_rank: a student rank's wiring (device, link, parts, gradient reducer) and its loop.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "job/train_job.hpp"
#include "model/wan_lora.hpp"
#include "comm/gradient_reducer.hpp"
#include "comm/mpi_check.hpp"
#include "comm/mpi_runtime.hpp"
#include "comm/transport_factory.hpp"
#include "core/torch_compat.hpp"
#include "comm/score_channel.hpp"
#include "student/dmd.hpp"
#include "student/ema.hpp"
#include "student/student_device.hpp"
#include "job/plan_input.hpp"
#include "teacher/colocated_teacher.hpp"
#include "teacher/flow_targets.hpp"
#include "student/student_loop.hpp"
#include "student/student_model.hpp"
#include "student/student_parts.hpp"
#include "student/train_state.hpp"

namespace wd::job {

namespace {

namespace fs = std::filesystem;

/// The seed a model's trainable tensors draw from: train.seed for the student (a pair's high
/// expert draws as a single student does), salted for a critic and for a pair's low expert, so
/// no two of them start alike.
std::uint64_t init_seed(const RunConfig& cfg, bool critic, std::optional<std::size_t> expert = std::nullopt) {
  constexpr std::uint64_t kCriticSalt = 0xC817ULL;
  constexpr std::uint64_t kLowExpertSalt = 0x10E5ULL;
  auto seed = cfg.train.seed;
  if (critic) seed ^= kCriticSalt;
  if (expert == WanExperts::kLow) seed ^= kLowExpertSalt;
  return seed;
}

/// Warns when this rank's GPU is shared with other students. A GPU is told by its PCI bus id,
/// gathered from every student (collective over the student group), not by its CUDA index:
/// under per-rank CUDA_VISIBLE_DEVICES every rank sees its own GPU as cuda:0. A teacher on this
/// GPU shows in the link's backend line instead.
void warn_if_gpu_shared(const TrainJob& job, const c10::Device& device, comm::HealthChannel& health) {
  if (!device.is_cuda()) return;  // student.device is one setting: every student returns here alike
  const auto ends = comm::gather_devices(job.groups->students(), job.world_rank(), device,
                                         job.cfg.comm.timeout_s, "exchange student devices", &health);
  const auto others = comm::sharing_gpu_with(ends, job.world_rank());
  if (others.empty()) return;
  std::string names;
  for (const auto& other : others) names += (names.empty() ? "" : ", ") + other.describe();
  const auto me = std::find_if(ends.begin(), ends.end(),
                               [&](const comm::RankDevice& e) { return e.world_rank == job.world_rank(); });
  spdlog::warn("this rank's GPU, {}, is shared with {}: links and the gradient all-reduce between "
               "ranks on one GPU go over MPI (NCCL refuses two ranks on one GPU)",
               me->describe(), names);
}

/// What a rank that computes its own messages reads: its share of the data, in the order and
/// with the noise a teacher rank would use for it (run_teacher_rank's noisers).
struct LocalData {
  data::DatasetReader reader;
  data::SampleSchedule schedule;
  data::FlowMatchingNoiser noiser, eval_noiser;

  explicit LocalData(const TrainJob& job)
      : reader(*job.info),
        schedule(job.train_samples, job.per_replica, job.layout.replicas, job.cfg.train.seed),
        noiser(job.cfg.noise, job.cfg.train.seed, job.student_range()),
        eval_noiser(job.cfg.noise, job.cfg.train.seed ^ 0xE7A1ULL, job.student_range()) {}
};

/// teacher.placement = colocated: this rank's own teacher (all blocks on the student's device,
/// teacher.compute and micro_batch as on a teacher rank) and its data: the messages a teacher
/// rank would have sent it, computed here.
struct OwnTeacher {
  teacher::TeacherStage stage;
  LocalData data;
  std::unique_ptr<teacher::TrajectoryRounds> trajectory;  ///< train.objective trajectory
  teacher::ColocatedTeacher transport;

  OwnTeacher(const TrainJob& job, const c10::Device& device, RankMemory& memory)
      : stage(load_teacher_stage(job, load_for(job, device), memory)),
        data(job),
        trajectory(job.cfg.train.trajectory_stream() ? std::make_unique<teacher::TrajectoryRounds>(teacher::TrajectorySource{
                                                    stage, data.reader, data.schedule, job.plan,
                                                    job.trajectory_spec(), job.layout.replica_of(job.world_rank()),
                                                    job.layout.replicas, job.per_replica, job.train_samples,
                                                    job.cfg.train.seed})
                                              : nullptr),
        transport({stage, data.reader, data.schedule, data.noiser, data.eval_noiser, job.plan,
                   job.layout.replica_of(job.world_rank()), job.layout.replicas, job.train_samples, device,
                   trajectory.get()}) {}

  static teacher::StageLoad load_for(const TrainJob& job, const c10::Device& device) {
    teacher::StageLoad how;
    how.placement = job.placement;
    how.dtype = teacher_dtype(job.cfg);
    how.device = device;
    how.blocks = {0, job.teacher().config().num_layers};
    how.timeout_s = job.cfg.comm.timeout_s;
    return how;
  }
};

/// train.objective flow: this rank's targets from its share of the data (no teacher).
struct OwnTargets {
  LocalData data;
  teacher::FlowTargets transport;

  OwnTargets(const TrainJob& job, const c10::Device& device)
      : data(job),
        transport({data.reader, data.schedule, data.noiser, data.eval_noiser, job.plan, job.model.patch_size,
                   job.layout.replica_of(job.world_rank()), job.layout.replicas, job.train_samples,
                   job.cfg.train.cond_dropout, job.cfg.train.seed, device}) {}
};

/// This rank's device, current before anything is allocated (pinned link and gradient buffers
/// open a CUDA context on the current device): every rank on its own GPU, none on GPU 0 by default.
c10::Device take_student_device(const TrainJob& job, RoleServices& services) {
  const auto& cfg = job.cfg;
  const auto device = student::student_device(cfg.student.device, job.topo.local_rank);
  compat::set_current_device(device);
  if (device.is_cuda()) compat::allow_tf32_matmul(cfg.student.tf32);
  services.memory.device = device;
  warn_if_gpu_shared(job, device, services.health);
  if (job.world_rank() == job.layout.student_world_ranks().front()) {
    spdlog::info("students train on {} (student.device {})", device.is_cuda() ? "their GPUs" : "the host",
                 cfg.student.device);
  }
  return device;
}

/// Everything the student trains, created here, once, on its device; the loop creates nothing.
/// The parts' set-up of the student (and, without feature pairs, of the dmd critic).
student::PartsSetup parts_setup(const TrainJob& job, const c10::Device& device) {
  const auto& cfg = job.cfg;
  student::PartsSetup setup;
  setup.teacher_in_channels = job.plan.latent[0];
  setup.teacher_out_channels = job.plan.out_channels;
  setup.teacher_dim = job.model.dim;
  setup.feature_pairs = cfg.student.feature_pairs();
  setup.feature_weight = cfg.student.feature_weight;
  setup.train_projections = cfg.student.projection == "trained";
  setup.mixed_bf16 = cfg.student.precision == "bf16-mixed";
  setup.seed = cfg.train.seed;
  setup.device = device;
  if (cfg.student.lora_rank > 0 && job.experts) setup.lora_base = job.student_base().path();  // flow: refused below
  if (job.lora_pair()) {
    setup.lora_base = job.experts->expert(WanExperts::kHigh).path();
    setup.lora_base_low = job.experts->expert(WanExperts::kLow).path();
    setup.router = [experts = &*job.experts](const torch::Tensor& t) { return experts->route(t); };
  }
  return setup;
}

/// A teacher checkpoint's tensors as a frozen LoRA base (zero-copy views of the mapping where the
/// dtype is kept: the ranks of a node share its pages; bf16-mixed asks bf16): `expert` of a
/// two-expert teacher (a LoRA pair's), else student_base(). `key` names the setting that asked
/// for it in the error for a job without a teacher.
WanDiT load_frozen_base(const TrainJob& job, const char* key, std::optional<std::size_t> expert = std::nullopt) {
  WD_CHECK_AS(ConfigError, job.experts,
              key << " needs a teacher.checkpoint as its base (train.objective flow without a teacher has none)");
  const auto dtype = job.cfg.student.precision == "bf16-mixed" ? std::optional<c10::ScalarType>(torch::kBFloat16)
                                                                : std::nullopt;
  auto model = load_wan_dit(expert ? job.experts->expert(*expert) : job.student_base(), dtype);
  for (auto& p : model->parameters()) p.set_requires_grad(false);
  return model;
}

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

student::StudentParts make_student_parts(const TrainJob& job, const c10::Device& device,
                                        const teacher::TeacherStage* own) {
  const auto& cfg = job.cfg;
  const auto& tc = job.model;
  const auto setup = parts_setup(job, device);
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

/// Where a student's batches come from: its teacher rank's link, its own teacher (colocated) or
/// its own targets (flow).
struct StudentStream {
  std::unique_ptr<OwnTeacher> own;
  std::unique_ptr<OwnTargets> targets;
  std::unique_ptr<comm::Receiver> link;
  comm::Receiver* transport = nullptr;
};

StudentStream open_stream(const TrainJob& job, const c10::Device& device, RoleServices& services) {
  const auto& cfg = job.cfg;
  const auto& plan = job.plan;
  StudentStream s;
  if (!cfg.has_teacher()) {
    s.targets = std::make_unique<OwnTargets>(job, device);
    s.transport = &s.targets->transport;
  } else if (job.layout.colocated()) {
    s.own = std::make_unique<OwnTeacher>(job, device, services.memory);
    s.transport = &s.own->transport;
  } else {
    s.link = comm::make_receiver(comm::link_end(*job.groups, job.world_rank(), cfg.comm), plan.message_spec(),
                                 cfg.comm, 0, plan.end_step(), device, &services.health);
    services.memory.transport_bytes = plan.message_spec().bytes() * static_cast<std::uint64_t>(cfg.comm.prefetch_depth);
    s.transport = s.link.get();
  }
  return s;
}

/// teacher.placement colocated, dmd: this rank's own teacher answers its requests on the spot.
class LocalScore final : public student::RealScore {
 public:
  explicit LocalScore(teacher::TeacherStage& stage) : stage_(stage) {}
  void ask(std::int64_t cycle, const comm::TensorDict& request) override {
    teacher::StageBatch b;
    b.x_t = request.at("x_t");
    b.t = request.at("t");
    b.context = request.at("context");
    b.context_lens = request.at("context_lens");
    stage_.run(b);
    answer_ = b.out;
    cycle_ = cycle;
  }
  const torch::Tensor& answer(std::int64_t cycle) override {
    WD_CHECK(cycle == cycle_, "dmd: cycle " << cycle << " was not asked (the last request was cycle " << cycle_ << ")");
    return answer_;
  }
  void release(std::int64_t) override { answer_ = torch::Tensor(); }
  double wait_seconds() const override { return 0; }

 private:
  teacher::TeacherStage& stage_;
  torch::Tensor answer_;
  std::int64_t cycle_ = -1;
};

/// A trainable model's gradient reduction over the student group and, with student.shard, its
/// slice of the optimizer (optimizer: over the reducer's bound buckets; gradients: the shard owns
/// the gradient slice and the reducer is its reduce-scatter). Collective over the students.
struct Reduction {
  std::unique_ptr<student::OptimizerShard> shard;  ///< null: whole (no sharding, or one student)
  std::unique_ptr<comm::GradientReducer> reducer;
};

void log_shard(const TrainJob& job, const student::OptimizerShard& shard,
               std::int64_t padded, const char* what) {
  const auto& cfg = job.cfg;
  WD_CHECK_AS(ConfigError, !shard.views().empty(),
              "student.shard " << cfg.student.shard << ": the student's " << padded << " parameters leave rank "
                               << job.world_rank() << " no slice among " << shard.group_size()
                               << " students; use student.shard none");
  if (job.world_rank() != job.layout.student_world_ranks().front()) return;
  const auto total = shard.parameter_count();
  spdlog::info("student.shard {}: each of {} students keeps AdamW moments{} for {} of {} parameters "
               "(the last slice {} padding) of {}",
               cfg.student.shard, shard.group_size(),
               shard.gate() ? ", gradients and weights" : shard.owns_gradients() ? " and gradients" : "",
               shard.slice_size(), total, padded - total, what);
  if (const auto* gate = shard.gate()) {
    spdlog::info("student.shard parameters: {} blocks gathered for each use (forward and recomputation); between "
                 "uses each student holds its slice and the {} parameters outside the blocks ({:.2f} MiB of {:.2f})",
                 gate->block_count(), gate->root_parameters(), shard.weight_bytes() / 1048576.0,
                 4.0 * static_cast<double>(total) / 1048576.0);
  }
}

Reduction make_reduction(const TrainJob& job, student::StudentParts& parts, const c10::Device& device,
                         RoleServices& services, const char* what = "the student") {
  const auto& cfg = job.cfg;
  const auto mode = student::parse_shard_mode(cfg.student.shard);
  int students = 1;
  WD_CHECK_MPI(MPI_Comm_size(job.groups->students(), &students));
  Reduction r;
  const bool weights = mode == student::ShardMode::kParameters;
  WD_CHECK_AS(ConfigError, !weights || device.is_cpu(),
              "student.shard parameters runs on host students (MPI all-gathers from the backward); this student "
              "trains on " << device << ": set student.device cpu, or student.shard gradients");
  if ((mode == student::ShardMode::kGradients || weights) && students > 1) {
    r.shard = weights ? std::make_unique<student::OptimizerShard>(job.groups->students(), parts.trainable(),
                                                                  cfg.comm.bucket_bytes(), cfg.comm.timeout_s,
                                                                  job.world_rank(), &services.health,
                                                                  parts.block_units())
                      : std::make_unique<student::OptimizerShard>(job.groups->students(), parts.trainable(),
                                                                  cfg.comm.bucket_bytes(), cfg.comm.timeout_s,
                                                                  job.world_rank(), &services.health,
                                                                  parts.grad_sources());
    parts.set_gate(r.shard->gate());
    r.reducer = std::make_unique<student::ShardReducer>(*r.shard, &services.health);
    if (job.world_rank() == job.layout.student_world_ranks().front()) {
      spdlog::info("gradient reduce-scatter: mpi over {} students in {} buckets, started from the backward's "
                   "gradient hooks ({})",
                   students, r.shard->scatter()->bucket_count(), what);
    }
    log_shard(job, *r.shard, r.shard->slice_size() * students, what);
  } else {
    r.reducer = comm::make_gradient_reducer(job.groups->students(), parts.trainable(), cfg.comm.bucket_bytes(),
                                            cfg.comm.timeout_s, job.world_rank(), device, cfg.comm.backend,
                                            &services.health);
    if (mode != student::ShardMode::kNone && r.reducer->whole_buffer().defined()) {
      r.shard = std::make_unique<student::OptimizerShard>(job.groups->students(), parts.trainable(),
                                                          r.reducer->whole_buffer(), cfg.comm.timeout_s,
                                                          job.world_rank(), &services.health);
      log_shard(job, *r.shard, r.reducer->whole_buffer().numel(), what);
    } else if (mode != student::ShardMode::kNone && job.world_rank() == job.layout.student_world_ranks().front()) {
      spdlog::info("student.shard {}: one student, nothing to split ({}'s optimizer stays whole)", cfg.student.shard,
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
  return r;
}

/// train.objective dmd on a student rank: the critic (its parts, AdamW, gradient reducer), the
/// real score (the channel to the replica's teacher, or the colocated teacher) and the trainer.
struct DmdSide {
  student::TrainConfig train;  ///< the loop's [train] (RunConfig::student_train)
  std::optional<comm::StudentService> service;
  std::unique_ptr<student::RealScore> score;
  std::unique_ptr<student::StudentParts> critic;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  Reduction reduction;  ///< the critic's reducer and (student.shard) its slice
  std::unique_ptr<student::DmdTrainer> trainer;
};

/// A LoRA critic over `base`'s frozen tensors (bound: one copy for both), with its own adapters.
WanDiT lora_over(const TrainJob& job, const WanDiT& base, std::uint64_t seed) {
  WanDiT critic(base->config(), WanInit::kEmpty, base->dtype());
  for (const auto& p : base->named_parameters()) {
    if (!WanDiTImpl::is_lora_name(p.key())) critic->bind_parameter(p.key(), p.value());
  }
  for (auto& p : critic->parameters()) p.set_requires_grad(false);
  critic->add_lora(job.cfg.critic_lora(job.model.num_layers), seed);
  return critic;
}

/// The critic DiT of `sc` (RunConfig::critic_model_config): critic.init student starts it as the
/// generator starts, teacher as the teacher (every block of student.expert's model), random from
/// its own seed.
WanDiT build_critic(const TrainJob& job, const WanConfig& sc) {
  const auto& cfg = job.cfg;
  if (cfg.train.critic_init == "random") return WanDiT(sc, WanInit::kRandom, torch::kFloat, init_seed(cfg, true));
  auto init = cfg.student;
  if (cfg.train.critic_init == "teacher") {
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
  critic->add_lora(job.cfg.critic_lora(job.model.num_layers), seed);
  return critic;
}

student::StudentParts make_critic_parts(const TrainJob& job, const c10::Device& device,
                                        student::StudentParts& generator) {
  const auto& cfg = job.cfg;
  auto setup = parts_setup(job, device);
  setup.feature_pairs.clear();  // the critic matches no teacher features
  setup.gan = cfg.train.gan();
  setup.gan_block = cfg.train.critic_gan_block;
  if (cfg.critic_lora(job.model.num_layers).rank > 0 && generator.is_pair()) {
    // A pair's critic is a pair too: adapters over each expert's base, routed as the generator.
    const auto models = generator.models();  // {high, low}
    return student::StudentParts::pair(lora_over(job, models[0], init_seed(cfg, true, WanExperts::kHigh)),
                                       lora_over(job, models[1], init_seed(cfg, true, WanExperts::kLow)), setup);
  }
  if (cfg.critic_lora(job.model.num_layers).rank > 0) {
    setup.lora_base = job.student_base().path();
    return student::StudentParts(make_lora_critic(job, generator), setup);
  }
  const auto sc = cfg.critic_model_config(job.model);
  if (cfg.train.critic_dims() && job.world_rank() == job.layout.student_world_ranks().front()) {
    spdlog::info("dmd critic of its own dims: dim {}, ffn {}, {} heads, {} blocks ({} parameters; the student's: {})",
                 sc.dim, sc.ffn_dim, sc.num_heads, sc.num_layers, wan_param_count(sc),
                 wan_param_count(cfg.student.model_config(job.model)));
  }
  return student::StudentParts(build_critic(job, sc), setup);
}

/// The channel to the teacher (dedicated layouts; right after the link, as the teacher makes it).
void open_service(DmdSide& side, const TrainJob& job, const c10::Device& device, RoleServices& services) {
  side.service = comm::student_service(*job.groups, job.world_rank(), job.plan, service_schedule(job.cfg, job.plan),
                                       job.cfg.comm, device, &services.health);
  side.score = std::make_unique<student::RemoteScore>(*side.service->requests, *side.service->answers);
}

/// The critic and the trainer, after the generator's reducer (every student makes its reducers in
/// one order).
void make_dmd_trainer(DmdSide& side, const TrainJob& job, student::StudentParts& generator, const c10::Device& device,
                      int group_rank, const std::vector<int>& peers, RoleServices& services) {
  const auto& cfg = job.cfg;
  side.train = cfg.student_train();
  side.critic = std::make_unique<student::StudentParts>(make_critic_parts(job, device, generator));
  const auto& train = cfg.train;
  // The critic shards as the student does (the same code: a trainable model and its optimizer).
  side.reduction = make_reduction(job, *side.critic, device, services, "the dmd critic");
  auto* shard = side.reduction.shard.get();
  side.optimizer = std::make_unique<torch::optim::AdamW>(
      shard ? shard->views() : side.critic->trainable(),
      torch::optim::AdamWOptions(train.critic_lr > 0 ? train.critic_lr : train.lr)
          .betas({train.beta1, train.beta2})
          .weight_decay(train.weight_decay));
  services.memory.model.weights_bytes += shard ? shard->weight_bytes() : memory::tensor_bytes(side.critic->trainable());
  student::DmdParts parts{generator,
                          *side.critic,
                          *side.optimizer,
                          side.reduction.reducer.get(),
                          *side.score,
                          student::DmdSpec::from(cfg.student_train(), job.plan.latent, group_rank),
                          service_schedule(cfg, job.plan),
                          side.train,
                          student::CheckpointPolicy::parse(cfg.student.checkpointing),
                          job.world_rank(),
                          job.groups->students(),
                          cfg.comm.timeout_s,
                          peers,
                          &services.health,
                          shard};
  side.trainer = std::make_unique<student::DmdTrainer>(std::move(parts));
}

/// student.shard: every student writes its own moment slices into the checkpoint the first one
/// is writing. That one's temporary directory goes to every student (`dir`: the first student's;
/// ignored elsewhere), each writes its slices there (`write`), and all agree they have before
/// the first seals it. Collective over the students; waits with the deadline, polling health.
void write_slices_together(const TrainJob& job, const std::string& dir, std::int64_t step,
                           comm::HealthChannel* health, const std::function<void(const std::string&)>& write) {
  constexpr std::int64_t kMax = 4096;
  WD_CHECK(static_cast<std::int64_t>(dir.size()) < kMax, "checkpoint directory name longer than " << kMax << ": " << dir);
  auto buffer = torch::zeros({kMax}, torch::kChar);
  std::memcpy(buffer.data_ptr(), dir.data(), dir.size());
  std::vector<int> peers;
  for (int r : job.layout.student_world_ranks()) {
    if (r != job.world_rank()) peers.push_back(r);
  }
  const auto wait = [&](MPI_Request& request, const char* op) {
    try {
      comm::wait_with_deadline(request, {op, step, static_cast<std::uint64_t>(kMax), peers},
                               std::chrono::duration<double>(job.cfg.comm.timeout_s), job.world_rank(), health);
    } catch (...) {
      comm::keep_until_exit(buffer);
      throw;
    }
  };
  MPI_Request request;
  WD_CHECK_MPI(MPI_Ibcast(buffer.data_ptr(), static_cast<int>(kMax), MPI_CHAR, 0, job.groups->students(), &request));
  wait(request, "share checkpoint directory");
  const std::string shared(static_cast<const char*>(buffer.data_ptr()));
  if (dir.empty()) write(shared);  // the first student wrote its slices with its files
  WD_CHECK_MPI(MPI_Ibarrier(job.groups->students(), &request));
  wait(request, "write moment slices");
}

/// The loop's checkpoint hooks: restore from job.resume_path, and save (the first student writes
/// through the store; every replica holds the same state, except that with student.shard each
/// student writes its own slices of the AdamW moments into the same checkpoint).
void attach_checkpoints(student::StudentJob& loop, TrainJob& job, student::StudentParts& parts,
                        RoleServices& services, const c10::Device& device) {
  loop.checkpoint_every = job.cfg.checkpoint.every;
  student::EmaWeights* ema = loop.ema;
  student::DmdTrainer* dmd = loop.dmd;
  student::OptimizerShard* shard = loop.shard;
  if (!job.resume_path.empty()) {
    loop.restore = [&job, &parts, ema, dmd, shard](torch::optim::AdamW& optimizer) {
      student::WholeWeights whole(shard);  // student.shard parameters: the load writes whole tensors
      const auto cursor = student::load_train_state(job.resume_path, parts, optimizer, shard);
      whole.adopt();
      WD_CHECK_DATA(cursor.step == job.plan.first_step, job.resume_path, "trainer.json",
                    "step " << cursor.step << " differs from the manifest's step " << job.plan.first_step);
      if (ema) ema->restore(job.resume_path, parts);
      if (dmd) dmd->restore(job.resume_path);
    };
  }
  loop.save = [&job, &parts, ema, dmd, shard, &services, device](std::int64_t step, torch::optim::AdamW& optimizer) {
    // Every student joins the gathers (the dmd cycle's request inputs, student.shard parameters'
    // whole weights) and the slices' step counts; the first one writes, the others add their
    // moment slices.
    const student::WholeWeights whole(shard), critic_whole(dmd ? dmd->critic_shard() : nullptr);
    const auto pending = dmd ? dmd->gather_pending(step) : TensorMap{};
    const auto slice = shard ? std::optional(shard->moment_slice(optimizer, step)) : std::nullopt;
    const auto critic_slice = dmd ? dmd->critic_moment_slice(step) : std::nullopt;
    const bool sliced = slice || critic_slice;
    const auto write_slices = [&](const std::string& dir) {
      if (slice) student::write_moment_slice(dir, *slice);
      if (critic_slice) student::write_moment_slice(student::DmdTrainer::critic_dir(dir), *critic_slice);
    };
    if (!job.store) {
      if (sliced) write_slices_together(job, "", step, &services.health, write_slices);
      return;
    }
    const auto path = job.store->save(step, [&](const std::string& dir) {
      // With a weight average, checkpoints keep both and student/ holds the average.
      student::save_train_state(dir, parts, optimizer, {step}, job.config_ini, /*export_student=*/ema == nullptr,
                                slice ? &*slice : nullptr);
      if (dmd) dmd->save(dir, step, job.config_ini, pending, critic_slice ? &*critic_slice : nullptr);
      if (ema) {
        ema->save(dir, parts);
        ema->with_averaged(parts, [&] { parts.save((fs::path(dir) / student::TrainStateFiles::kStudent).string()); });
      }
      if (sliced) write_slices_together(job, dir, step, &services.health, write_slices);
      // Mid-save: the files are written, the checkpoint is neither sealed nor renamed.
      services.faults.at(FaultSpec::Point::kSave, step, device);
    });
    spdlog::info("checkpoint of step {} written to {}", step, path);
  };
}

/// What the loop reports; the students' first rank saves the student unless stopped for a requeue.
RoleResult finish_student(const TrainJob& job, const student::StudentStats& stats, student::StudentParts& parts,
                          const student::EmaWeights* ema, bool first) {
  const auto& plan = job.plan;
  RoleResult result;
  result.requeue = stats.stopped_after >= 0;
  result.summary = {1, stats.seconds, 1 - stats.wait_seconds / stats.seconds, stats.wait_seconds / stats.seconds,
                    static_cast<double>((plan.train_steps - plan.first_step) * plan.micro_batches *
                                        plan.batch_per_student),
                    0};
  if (first && !result.requeue) {
    const auto dir = (fs::path(job.cfg.run_dir) / "student").string();
    if (ema) {
      ema->with_averaged(parts, [&] { parts.save(dir); });
    } else {
      parts.save(dir);
    }
    spdlog::info("student{} saved to {} ({} params); held-out relative MSE {:.5f} -> {:.5f}; "
                 "{:.1f} s, waiting for batches {:.0f}%",
                 ema ? " (its weight average, train.ema_decay)" : "", dir,
                 static_cast<std::int64_t>(parts.models().size()) * wan_param_count(parts.model()->config()),
                 stats.first_eval_rel_mse,
                 stats.final_eval_rel_mse, stats.seconds, 100 * stats.wait_seconds / stats.seconds);
  }
  return result;
}

}  // namespace

RoleResult run_student_rank(TrainJob& job, RoleServices& services) {
  const auto& cfg = job.cfg;
  const auto& layout = job.layout;
  const int rank = job.world_rank();
  const auto device = take_student_device(job, services);
  // Link first (and dmd's channel), gradient groups second, on every student: NCCL communicators
  // are created in one order everywhere (docs/transport.md).
  auto stream = open_stream(job, device, services);
  DmdSide dmd;
  if (cfg.train.dmd() && stream.link) open_service(dmd, job, device, services);
  if (cfg.train.dmd() && stream.own) dmd.score = std::make_unique<LocalScore>(stream.own->stage);
  auto parts = make_student_parts(job, device, stream.own ? &stream.own->stage : nullptr);
  if (parts.model()->lora().rank > 0) {
    // A LoRA student's frozen base, reported as the frozen teacher weights this rank holds (the
    // tensors a colocated teacher already counted once: not again).
    std::set<const void*> counted;
    if (stream.own) {
      for (const auto& m : stream.own->stage.experts()) {
        for (const auto& p : m.model->parameters()) counted.insert(p.data_ptr());
      }
    }
    std::vector<torch::Tensor> base;
    for (const auto& model : parts.models()) {
      for (const auto& p : model->parameters()) {
        if (!p.requires_grad() && !counted.count(p.data_ptr())) base.push_back(p);
      }
    }
    services.memory.teacher_weights_bytes += memory::tensor_bytes(base);
  }
  auto reduction = make_reduction(job, parts, device, services);
  // The weights this rank keeps (student.shard parameters: its slice and the blocks' outside).
  services.memory.model.weights_bytes =
      reduction.shard ? reduction.shard->weight_bytes() : memory::tensor_bytes(parts.trainable());
  int group_rank = 0;
  WD_CHECK_MPI(MPI_Comm_rank(job.groups->students(), &group_rank));
  std::vector<int> peers;
  for (int r : layout.student_world_ranks()) {
    if (r != rank) peers.push_back(r);
  }
  if (cfg.train.dmd()) make_dmd_trainer(dmd, job, parts, device, group_rank, peers, services);
  const auto train = cfg.student_train();
  student::StudentJob loop{parts, *stream.transport, *reduction.reducer, job.plan, train, job.groups->students(),
                           cfg.comm.timeout_s, rank, peers, group_rank == 0,
                           (fs::path(cfg.run_dir) / "metrics.jsonl").string(),
                           student::CheckpointPolicy::parse(cfg.student.checkpointing)};
  loop.memory = &services.monitor;
  loop.health = &services.health;
  loop.faults = &services.faults;
  loop.teachers = layout.teacher_world_ranks();
  loop.tracked_memory = &services.memory.model;
  std::optional<student::EmaWeights> ema;
  if (train.ema_decay > 0) loop.ema = &ema.emplace(parts, train.ema_decay);
  loop.dmd = dmd.trainer.get();
  loop.shard = reduction.shard.get();
  if (dmd.score) loop.extra_wait = [score = dmd.score.get()] { return score->wait_seconds(); };
  attach_checkpoints(loop, job, parts, services, device);
  const auto stats = student::run_student(loop);
  const student::WholeWeights whole(loop.shard);  // student.shard parameters: the first student writes them all
  return finish_student(job, stats, parts, loop.ema, group_rank == 0);
}

}  // namespace wd::job
