// The start-up stages of `train` (startup.hpp): what each decides, on the rank that decides.
// No MPI here: start_train.cpp makes the ranks agree.
#include "job/startup.hpp"

#include "comm/score_channel.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "comm/score_channel.hpp"
#include "core/logging.hpp"
#include "core/torch_compat.hpp"
#include "data/dataset_schema.hpp"
#include "data/synthetic_dataset.hpp"
#include "job/calibrate.hpp"
#include "job/plan_input.hpp"
#include "model/image_condition.hpp"
#include "memory/host_memory.hpp"
#include "model/wan_lora.hpp"
#include "model/safetensors.hpp"
#include "plan/speed.hpp"
#include "student/student_device.hpp"
#include "teacher/compute_dtype.hpp"
#include "teacher/placement.hpp"

namespace wd::job {

namespace {

namespace fs = std::filesystem;
constexpr std::uint64_t kBuiltinSeed = 20251122;

/// The planner's view of this job and machine: the teacher's and data set's shapes, `world`
/// ranks, the memory of `device` (a GPU: teacher.gpu_memory, else measured) and of the host.
PlanContext plan_context(const RunConfig& cfg, const WanExperts& experts, int world, const c10::Device& device) {
  const auto& ck = experts.expert(0);
  const auto info = data::validate_dataset(cfg.data_path(), dataset_expectations(ck.config(), cfg.data.ignore_condition));
  PlanContext ctx;
  ctx.teacher = ck.config();
  ctx.stored_elem_bytes = stored_elem_bytes(ck);
  ctx.experts = static_cast<std::int64_t>(experts.size());
  ctx.latent = info.latent_shape;
  ctx.context_len = info.context_len;
  ctx.world = world;
  ctx.cpu_job = device.is_cpu();
  if (device.is_cuda()) {
    ctx.gpus_per_node = static_cast<int>(torch::cuda::device_count());
    // device_memory initialises LibTorch's CUDA state first: the allocator cannot be asked before.
    ctx.gpu_bytes = cfg.teacher.gpu_memory.empty() ? compat::device_memory(device).total_bytes
                                                   : parse_size(cfg.teacher.gpu_memory, "teacher.gpu_memory");
  }
  ctx.host_bytes = cfg.teacher.host_memory.empty() ? memory::host_total_bytes()
                                                   : parse_size(cfg.teacher.host_memory, "teacher.host_memory");
  return ctx;
}

/// teacher.placement auto: what the planner recommends for this job on this machine.
plan::Placement planned_placement(const RunConfig& cfg, int world) {
  if (!compat::cuda_available()) {
    spdlog::info("teacher.placement auto: cpu (no CUDA device is usable here, so the teacher computes on the host)");
    return plan::Placement::kCpu;
  }
  const auto ctx = plan_context(cfg, open_teacher(cfg), world, c10::Device(torch::kCUDA, 0));
  const auto plan = plan::make_plan(make_plan_input(cfg, ctx));
  const auto gpu = format_bytes(static_cast<double>(ctx.gpu_bytes));
  const auto host = format_bytes(static_cast<double>(ctx.host_bytes));
  WD_CHECK_AS(ConfigError, plan.recommended.has_value(),
              "teacher.placement auto: no placement fits " << gpu << " per GPU and " << host << " per node: "
                                                           << plan.reason
                                                           << " (see `wan-distill plan` with the same config)");
  spdlog::info("teacher.placement auto: {} ({}; planned with {} per GPU, {} per node)",
               plan::placement_name(*plan.recommended), plan.reason, gpu, host);
  return *plan.recommended;
}

/// Why a colocated teacher cannot sit beside a student on one GPU of this job ("" if it fits,
/// or the job is on the host): the `gpu` placement's teacher and student on one device.
std::string colocated_misfit(const plan::PlanInput& in, const PlanContext& ctx) {
  if (ctx.cpu_job) return "";
  for (const auto& p : plan::make_plan(in).placements) {
    if (p.placement != plan::Placement::kGpu) continue;
    // A LoRA base in the teacher's dtype is the colocated teacher's own tensors: counted once.
    const auto need = p.teacher.device_total() + p.student.device_total() -
                      (in.lora_base_shareable ? in.lora_base_bytes : 0);
    if (need > ctx.gpu_bytes) {
      return "the teacher and a student need " + format_bytes(static_cast<double>(need)) + " on one GPU of " +
             format_bytes(static_cast<double>(ctx.gpu_bytes));
    }
  }
  return "";
}

/// The fastest of `layouts` (fastest first) that suits the job; logs every one ruled out.
const plan::LayoutSpeed* fastest_suitable(const RunConfig& cfg, const std::vector<plan::LayoutSpeed>& layouts,
                                          const std::string& colocated_misfit) {
  const bool broadcast = cfg.comm.mode == CommMode::kBroadcast;
  const plan::LayoutSpeed* pick = nullptr;
  for (const auto& l : layouts) {
    const int replicas = l.colocated ? l.students : l.teacher_ranks / l.stages;
    const auto global = cfg.train.batch_size * (broadcast ? replicas : l.students);
    std::string why_not;
    if (cfg.train.eval_samples % global != 0) {
      why_not = "train.eval_samples(" + std::to_string(cfg.train.eval_samples) +
                ") is not a multiple of its global batch " + std::to_string(global);
    } else if (l.colocated && !colocated_misfit.empty()) {
      why_not = colocated_misfit;
    }
    // Every layout ruled out is named, faster or slower than the pick: a user who expected it
    // learns why not.
    if (!why_not.empty()) {
      spdlog::info("teacher.layout auto: not {}: {}", l.name, why_not);
    } else if (!pick) {
      pick = &l;
    }
  }
  return pick;
}

}  // namespace

WanConfig model_for_data(const data::DatasetInfo& info, const std::string& model_type) {
  auto c = WanConfig::preset("tiny");
  c.in_dim = c.out_dim = info.latent_shape[0];
  c.text_dim = info.text_dim;
  c.text_len = info.context_len;
  if (!model_type.empty()) c.model_type = model_type;
  // An i2v model's in_dim counts y's mask and image channels too.
  if (c.model_type == "i2v") c.in_dim = 2 * c.out_dim + kI2vMaskChannels;
  return c;
}

void prepare_run_dir(const RunConfig& cfg) {
  fs::create_directories(fs::path(cfg.run_dir) / "cache");
  const bool has_teacher = cfg.has_teacher();
  if (has_teacher && cfg.teacher.checkpoint == kBuiltin &&
      !fs::exists(fs::path(cfg.teacher_path()) / "config.json")) {
    spdlog::info("generating the builtin tiny teacher in {}", cfg.teacher_path());
    write_random_wan_checkpoint(cfg.teacher_path(), WanConfig::preset("tiny"), torch::kBFloat16,
                                2'000'000'000ULL, kBuiltinSeed);
  }
  if (cfg.data.path == kBuiltin && !fs::exists(cfg.data_path())) {
    // A two-expert folder's shapes too; without a teacher, the tiny model's.
    auto tc = has_teacher ? open_teacher(cfg).config() : WanConfig::preset("tiny");
    if (!has_teacher && !cfg.student.model_type.empty()) tc.model_type = cfg.student.model_type;
    data::SyntheticDatasetSpec spec;
    spec.output = cfg.data_path();
    spec.samples = cfg.data.builtin_samples;
    // An i2v teacher's in_dim also counts y's channels. An image-conditioned teacher's data set
    // holds the images (/condition): i2v needs them, ti2v trains its image mode from them.
    spec.latent = {latent_channels_of(tc), 3, 16, 16};
    spec.condition = image_condition_of(tc);
    spec.text_len = tc.text_len;
    spec.text_dim = tc.text_dim;
    spec.seed = kBuiltinSeed;
    spdlog::info("generating the builtin tiny data set {}", spec.output);
    data::write_synthetic_dataset(spec);
  }
}

LayoutChoice choose_layout(const RunConfig& cfg, int world) {
  const auto saved = fs::path(cfg.run_dir) / "layout.json";
  if (!cfg.checkpoint.resume.empty() && fs::exists(saved)) {
    const auto j = nlohmann::json::parse(std::ifstream(saved));
    spdlog::info("teacher.layout auto: resuming with the layout of the first start ({}): {}", saved.string(),
                 j.at("layout").get<std::string>());
    return {j.at("colocated").get<bool>(), j.at("teacher_ranks").get<int>(), j.at("stages").get<int>(),
            j.value("micro_batch", std::int64_t{0})};
  }
  const auto experts = open_teacher(cfg);
  const auto device = student::student_device(cfg.student.device, 0);
  compat::set_current_device(device);  // world rank 0 times on its own device
  const auto ctx = plan_context(cfg, experts, world, device);
  const auto in = make_plan_input(cfg, ctx);
  const auto weights = timed_weight_dtype(cfg, ctx.stored_elem_bytes);
  const auto speed = speed_input(cfg, in, ctx.teacher, weights, ctx.latent, world, device, -1, 0, 0, Calibrate::kYes);
  const auto layouts = plan::predict_layouts(*speed);
  spdlog::info("teacher.layout auto:\n{}", plan::format_speeds(*speed, layouts));
  const auto* pick = fastest_suitable(cfg, layouts, colocated_misfit(in, ctx));
  if (!pick) {
    throw ConfigError("teacher.layout auto: no layout of " + std::to_string(world) + " ranks suits this job (see the "
                      "reasons above); set teacher.ranks and teacher.placement, or change train.eval_samples");
  }
  const auto& l = *pick;
  spdlog::info("teacher.layout auto: {} ({:.2f} samples/s predicted, student wait {:.0f}%)", l.name, l.samples_per_s,
               100 * l.student_wait);
  std::ofstream(saved) << nlohmann::json{{"layout", l.name}, {"colocated", l.colocated},
                                         {"teacher_ranks", l.teacher_ranks}, {"stages", l.stages},
                                         {"micro_batch", l.micro_batch}, {"flags", plan::layout_flags(l)},
                                         {"samples_per_s", l.samples_per_s}}
                              .dump(2)
                       << "\n";
  return {l.colocated, l.teacher_ranks, l.stages, l.micro_batch};
}

void apply_layout(const LayoutChoice& choice, teacher::TeacherConfig& teacher) {
  const bool fixed_by_layout =
      teacher.placement == TeacherPlacement::kColocated || teacher.placement == TeacherPlacement::kShard;
  teacher.ranks = choice.colocated ? 1 : choice.teacher_ranks;
  teacher.stages = choice.colocated || choice.stages <= 1 ? 0 : choice.stages;
  teacher.placement = choice.colocated      ? TeacherPlacement::kColocated
                      : choice.stages > 1   ? TeacherPlacement::kShard
                      : fixed_by_layout     ? TeacherPlacement::kAuto
                                            : teacher.placement;
  // The choice's teacher micro-batch, unless one was given as a number of samples.
  if (teacher.micro_batch_samples().value_or(0) == 0) teacher.micro_batch = std::to_string(choice.micro_batch);
}

PlacementChoice choose_placement(const RunConfig& cfg, int world) {
  PlacementChoice choice;
  // A colocated teacher lives where the student computes; without a teacher (flow) that device
  // is all there is to record.
  const bool teacherless = !cfg.has_teacher();
  c10::Device device(torch::kCPU);
  if (teacherless || cfg.teacher.placement == TeacherPlacement::kColocated || cfg.cache_only()) {
    device = student::student_device(cfg.student.device, 0);
    choice.placement = device.is_cuda() ? plan::Placement::kGpu : plan::Placement::kCpu;
  } else {
    choice.placement = cfg.teacher.placement == TeacherPlacement::kAuto
                           ? planned_placement(cfg, world)
                           : teacher::parse_placement(name_of(cfg.teacher.placement));
    // A placement this build cannot run (gpu without CUDA, a bad teacher.device) stops the
    // job here, before anything is loaded.
    device = teacher::teacher_device(cfg.teacher, choice.placement, 0);
  }
  compat::set_current_device(device);
  if (teacherless) {
    spdlog::info("train.objective {}: no teacher; the students train on the data alone", cfg.train.objective);
    return choice;
  }
  if (cfg.cache_only()) return choice;  // no teacher forward: the batches are the cache's
  // teacher.dtype auto keeps each tensor as stored (fp32 islands included): no one dtype to
  // measure, so the matmuls follow the weights.
  const auto weights = teacher_dtype(cfg);
  const auto compute = weights ? teacher::choose_compute(cfg.teacher.compute, *weights, device)
                               : teacher::ComputeChoice{std::nullopt, "teacher.dtype auto: matmuls in each weight's stored dtype"};
  choice.compute = compute.dtype;
  spdlog::info("{}", compute.reason);
  return choice;
}

comm::Layout make_layout(const RunConfig& cfg, plan::Placement placement, int world,
                         const std::vector<int>& node_of_rank) {
  return layout_with_stages(cfg, world, teacher::stages_for(cfg.teacher, placement), node_of_rank);
}

comm::Layout layout_with_stages(const RunConfig& cfg, int world, int stages, const std::vector<int>& node_of_rank) {
  if (cfg.students_only()) return comm::Layout::colocated(world);
  return comm::Layout::make(world, cfg.teacher.ranks, stages, node_of_rank);
}

int planned_gpu(const RunConfig& cfg, plan::Placement placement, Role role, int local_rank, int gpus) {
  const auto on_gpu = gpu_of_local_rank(local_rank, gpus);
  if (role == Role::kStudent || cfg.students_only()) {
    return cfg.student.device == DeviceChoice::kCpu ? -1 : on_gpu;
  }
  if (placement == plan::Placement::kCpu) return -1;
  if (!cfg.teacher.device.empty()) {
    const c10::Device device(cfg.teacher.device);
    return device.is_cpu() ? -1 : device.index() < 0 ? 0 : device.index();
  }
  return on_gpu;
}

c10::Device rank_device(const RunConfig& cfg, plan::Placement placement, Role role, int local_rank) {
  if (role == Role::kStudent) return student::student_device(cfg.student.device, local_rank);
  return teacher::teacher_device(cfg.teacher, placement, local_rank);
}

std::int64_t per_replica_batch(const RunConfig& cfg, const comm::Layout& layout) {
  // A sequence-parallel group of N students shares its samples: S/R/N groups a replica.
  return cfg.train.batch_size * (cfg.comm.mode == CommMode::kBroadcast
                                     ? 1
                                     : std::max<std::int64_t>(1, layout.students_per_replica() /
                                                                     std::max<std::int64_t>(1, cfg.student.sequence_parallel)));
}

std::int64_t global_batch(const RunConfig& cfg, const comm::Layout& layout) {
  if (cfg.comm.mode == CommMode::kBroadcast) return cfg.train.batch_size * layout.replicas;
  // One batch per sequence-parallel group of the student world: a replica's groups, or, where
  // every student is its own replica (teacher.ranks 0, reading a teacher cache), groups that span
  // replicas.
  return cfg.train.batch_size *
         std::max<std::int64_t>(1, layout.student_ranks / std::max<std::int64_t>(1, cfg.student.sequence_parallel));
}

void check_job(const RunConfig& cfg, const WanConfig& teacher, const comm::Layout& layout) {
  ConfigProblems p;
  validate_with_teacher(cfg, teacher, layout.stages, p);
  const bool broadcast = cfg.comm.mode == CommMode::kBroadcast;
  const auto global = global_batch(cfg, layout);
  p.check(cfg.train.eval_samples % global == 0,
          "train.eval_samples(" + std::to_string(cfg.train.eval_samples) +
              ") must be a multiple of the global batch " + std::to_string(global) + " (train.batch_size(" +
              std::to_string(cfg.train.batch_size) + ") x " +
              std::to_string(global / cfg.train.batch_size) +
              (broadcast ? " replicas" : cfg.student.sequence_parallel > 1 ? " sequence-parallel groups" : " students") +
              ")");
  if (const auto fault = FaultSpec::parse(cfg.inject_fault)) {
    const int count = fault->role == Role::kTeacher ? layout.teacher_ranks : layout.student_ranks;
    p.check(fault->role_rank < count && fault->step <= cfg.train.steps,
            "inject-fault(" + cfg.inject_fault + ") needs RANK < " + std::to_string(count) + " " +
                role_name(fault->role) + " ranks and STEP <= train.steps(" + std::to_string(cfg.train.steps) + ")");
    const auto every = cfg.checkpoint.every;
    p.check(fault->point != FaultSpec::Point::kSave || fault->step == cfg.train.steps ||
                (every > 0 && fault->step % every == 0),
            "inject-fault(" + cfg.inject_fault + ") strikes in the checkpoint save of step " +
                std::to_string(fault->step) + ", but none is written then: checkpoints follow every checkpoint.every(" +
                std::to_string(every) + ") steps (0: none mid-run) and the last step, train.steps(" +
                std::to_string(cfg.train.steps) + ")");
  }
  if (const auto fault = FaultSpec::parse(cfg.inject_fault); fault && fault->point == FaultSpec::Point::kAllgather) {
    p.check(cfg.student.shard == ShardMode::kOptimizer && layout.student_ranks > 1,
            "inject-fault(" + cfg.inject_fault + ") strikes in the all-gather of the updated parameter slices, which "
            "only student.shard optimizer over more than one student runs (student.shard(" + name_of(cfg.student.shard) +
            "), " + std::to_string(layout.student_ranks) + " student(s))");
  }
  if (const auto fault = FaultSpec::parse(cfg.inject_fault); fault && fault->point == FaultSpec::Point::kServe) {
    const bool serves = cfg.objective().traits().real_score;
    p.check(serves && layout.teacher_ranks > 0 && !layout.colocated(),
            "inject-fault(" + cfg.inject_fault + ") strikes in a real-score answer, which only teacher ranks of "
            "train.objective dmd give (not " + cfg.train.objective + (layout.colocated() ? ", colocated" : "") + ")");
    comm::ServiceSchedule schedule;
    schedule.ratio = cfg.dmd.critic_ratio;
    schedule.train_steps = cfg.train.steps;
    schedule.lead = cfg.comm.prefetch_depth;
    bool answered = false;
    for (auto c = schedule.first_cycle(); c < schedule.end_cycle(); ++c) answered |= schedule.answer_after(c) + 1 == fault->step;
    p.check(!serves || answered,
            "inject-fault(" + cfg.inject_fault + ") strikes in the real-score answer of step " +
                std::to_string(fault->step) + ", but the teacher answers after steps min(c·" +
                std::to_string(schedule.ratio) + " + comm.prefetch_depth, c·" + std::to_string(schedule.ratio) + " + " +
                std::to_string(schedule.ratio - 1) + ") + 1 only (train.critic_ratio)");
  }
  p.check(cfg.checkpoint.resume.empty() || cfg.checkpoint.resume == "auto" || fs::is_directory(cfg.checkpoint.resume),
          "resume(" + cfg.checkpoint.resume + ") must be auto, empty, or an existing checkpoint directory");
  cfg.objective().check_teacher(cfg.keys(), teacher, layout.stages, p);
  p.throw_if_any("train config");
  // Files the teacher's forwards read (a guided teacher's negative context), read where they will
  // be used: a bad one stops the job here.
  cfg.objective().check_teacher_files(cfg.keys(), teacher.text_dim);
}

void check_student_expert(const RunConfig& cfg, const WanExperts* experts) {
  const auto& expert = cfg.student.expert;
  const bool two = experts && experts->two_experts();
  WD_CHECK_AS(ConfigError, expert.empty() || two,
              "student.expert(" << expert << ") needs a two-expert (A14B) teacher.checkpoint; "
                                << (experts ? experts->path() + " is one model" : std::string("train.objective flow has none")));
  if (expert.empty()) {
    const bool pair = cfg.lora_pair(experts ? experts->size() : 0);
    // A LoRA pair: the feature heads would see each expert's hidden states apart.
    WD_CHECK_AS(ConfigError, !pair || cfg.student.feature_pairs().empty(),
                "student.features with a LoRA student of the two-expert teacher "
                    << experts->path() << " (a LoRA pair, one adapter set per expert) is not built; "
                       "set student.expert high or low to train one expert's adapters with feature matching");
    WD_CHECK_AS(ConfigError, !pair || !cfg.dmd.gan(),
                "critic.gan_weight with a LoRA student of the two-expert teacher " << experts->path()
                    << " (a LoRA pair, whose critic is a pair too) is not built; set critic.gan_weight 0");
    // A pair starts from a pair: checked here, before any rank loads a base.
    if (pair && !cfg.student.lora_init.empty()) {
      static_cast<void>(read_lora_pair(cfg.student.lora_init));
    }
    return;
  }
  ConfigProblems p;
  cfg.objective().check_expert(cfg.keys(), p);
  p.check(cfg.train.trajectory_rollout == 0,
          "student.expert(" + expert + ") with train.trajectory_rollout > 0: a rollout runs the student from noise "
          "through every interval, the other expert's too");
  p.check(cfg.train.sample_every == 0, "student.expert(" + expert + ") with train.sample_every > 0: a sampling probe "
                                       "runs the student from noise through every t, the other expert's too");
  p.throw_if_any("train config");
  // Ranges nothing reaches stop the job here: the student's steps, or the noise's σ distribution.
  cfg.objective().check_range(cfg.keys(), cfg.noise, expert_range(expert, experts));
}

data::DatasetInfo check_data(const RunConfig& cfg, const WanConfig& teacher) {
  auto info = data::validate_dataset(cfg.data_path(), dataset_expectations(teacher, cfg.data.ignore_condition));
  cfg.objective().check_data(cfg.keys(), info);
  WD_CHECK_DATA(info.samples > cfg.train.eval_samples, info.path, info.has_latents ? "/latents" : "/context",
                "has " << info.samples << " samples; train.eval_samples(" << cfg.train.eval_samples
                       << ") leaves none for training");
  return info;
}

std::int64_t choose_teacher_micro_batch(const TrainJob& job, const c10::Device& device) {
  const auto& cfg = job.cfg;
  const auto saved = fs::path(cfg.run_dir) / "micro_batch.json";
  if (!cfg.checkpoint.resume.empty() && fs::exists(saved)) {
    const auto n = nlohmann::json::parse(std::ifstream(saved)).at("micro_batch").get<std::int64_t>();
    spdlog::info("teacher.micro_batch auto: resuming with the first start's choice ({}): {}", saved.string(), n);
    return n;
  }
  const auto& ck = job.teacher();
  const auto weights = timed_weight_dtype(cfg, stored_elem_bytes(ck));
  compat::set_current_device(device);
  const auto choice = choose_micro_batch(ck.config(), weights, job.compute, job.plan.latent, job.plan.context_len,
                                         job.per_replica, device);
  spdlog::info("{}", choice.reason);
  std::ofstream(saved) << nlohmann::json{{"micro_batch", choice.samples},
                                         {"seconds_per_sample", choice.seconds_per_sample},
                                         {"batch", job.per_replica}}
                              .dump(2)
                       << "\n";
  return choice.samples;
}

std::string resume_path(const RunConfig& cfg, std::int64_t step) {
  if (step == 0) return "";
  return cfg.checkpoint.resume == "auto" ? (fs::path(cfg.checkpoint_root()) / CheckpointStore::dir_name(step)).string()
                                         : cfg.checkpoint.resume;
}

ResumePoint find_resume_point(const RunConfig& cfg, CheckpointStore& store) {
  ResumePoint at;
  if (cfg.checkpoint.resume == "auto") {
    if (const auto entry = store.latest_good()) {
      at = {entry->step, resume_path(cfg, entry->step)};
    } else {
      spdlog::info("resume auto: no good checkpoint in {}; starting at step 0", store.root());
    }
  } else if (!cfg.checkpoint.resume.empty()) {
    at = {CheckpointStore::verify(cfg.checkpoint.resume).step, cfg.checkpoint.resume};
  }
  WD_CHECK_AS(ConfigError, at.step < cfg.train.steps,
              "the checkpoint to resume from is at step " << at.step << "; train.steps(" << cfg.train.steps
                                                          << ") leaves nothing to train");
  return at;
}

}  // namespace wd::job
