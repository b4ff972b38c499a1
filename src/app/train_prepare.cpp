// prepare_train: the start-up stages every rank of `train` agrees on before its role starts.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "app/plan_calibrate.hpp"
#include "app/plan_input.hpp"
#include "app/rank_placement.hpp"
#include "app/train_job.hpp"
#include "comm/signals.hpp"
#include "comm/startup.hpp"
#include "core/logging.hpp"
#include "core/threads.hpp"
#include "core/torch_compat.hpp"
#include "data/data_config.hpp"
#include "data/synthetic_dataset.hpp"
#include "memory/host_memory.hpp"
#include "model/safetensors.hpp"
#include "plan/speed.hpp"
#include "student/student_device.hpp"
#include "teacher/compute_dtype.hpp"
#include "teacher/placement.hpp"

namespace wd::app {

namespace {

namespace fs = std::filesystem;
constexpr std::uint64_t kBuiltinSeed = 20251122;

/// Runs `stage` and makes every rank agree on its outcome (all throw, or none).
template <typename F>
void agreed(const std::string& stage, const RunConfig& cfg, F&& stage_fn) {
  std::exception_ptr failure;
  try {
    // A stop signal during start-up ends the stage on this rank, and so the job on all.
    if (const int signal = comm::stop_signal()) throw comm::Interrupted(signal);
    stage_fn();
  } catch (...) {
    failure = std::current_exception();
  }
  // Start-up runs before the health channel exists: its waits have none to poll.
  comm::agree_on_startup(stage, failure, MPI_COMM_WORLD, cfg.comm.timeout_s, nullptr);
}

/// Generates the builtin:tiny teacher and data set when missing (world rank 0 only).
void make_builtin_assets(const RunConfig& cfg) {
  if (cfg.teacher.checkpoint == kBuiltin && !fs::exists(fs::path(cfg.teacher_path()) / "config.json")) {
    spdlog::info("generating the builtin tiny teacher in {}", cfg.teacher_path());
    write_random_wan_checkpoint(cfg.teacher_path(), WanConfig::preset("tiny"), torch::kBFloat16,
                                2'000'000'000ULL, kBuiltinSeed);
  }
  if (cfg.data.path == kBuiltin && !fs::exists(cfg.data_path())) {
    const auto tc = open_teacher(cfg).config();  // a two-expert folder too
    data::SyntheticDatasetSpec spec;
    spec.output = cfg.data_path();
    spec.samples = cfg.data.builtin_samples;
    spec.latent = {tc.in_dim, 3, 16, 16};
    spec.text_len = tc.text_len;
    spec.text_dim = tc.text_dim;
    spec.seed = kBuiltinSeed;
    spdlog::info("generating the builtin tiny data set {}", spec.output);
    data::write_synthetic_dataset(spec);
  }
}

/// Intra-op threads by role: runtime.teacher_threads / student_threads, else runtime.threads,
/// else this node's cores shared out over its ranks. Every rank logs what it got and why.
void set_threads(const RunConfig& cfg, const Topology& topo) {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const bool teacher = topo.role == Role::kTeacher;
  const int by_role = teacher ? cfg.runtime.teacher_threads : cfg.runtime.student_threads;
  std::string why;
  int threads = 0;
  if (by_role > 0) {
    threads = by_role;
    why = teacher ? "runtime.teacher_threads" : "runtime.student_threads";
  } else if (cfg.runtime.threads > 0) {
    threads = cfg.runtime.threads;
    why = "runtime.threads";
  } else {
    threads = std::max(1, hw / topo.local_size);
    why = fmt::format("{} core(s) / {} rank(s) on this node", hw, topo.local_size);
  }
  set_intra_op_threads(threads);
  const auto blas = describe_blas_threads();
  spdlog::info("{} rank: {} intra-op thread(s) ({}){}", role_name(topo.role), threads, why,
               blas.empty() ? std::string() : ", " + blas);
}

/// teacher.placement = auto: what the planner recommends for this job, with the memory the
/// config gives or that is detected (rank 0 only; it reads the data set's shapes).
plan::Placement choose_placement(const RunConfig& cfg, int world) {
  if (!compat::cuda_available()) {
    spdlog::info("teacher.placement auto: cpu (no CUDA device is usable here, so the teacher computes on the host)");
    return plan::Placement::kCpu;
  }
  const auto experts = open_teacher(cfg);
  const auto& ck = experts.expert(0);
  const auto& tc = ck.config();
  const auto info = data::validate_dataset(cfg.data_path(), dataset_expectations(tc));
  PlanContext ctx;
  ctx.teacher = tc;
  ctx.stored_elem_bytes = stored_elem_bytes(ck);
  ctx.experts = static_cast<std::int64_t>(experts.size());
  ctx.latent = info.latent_shape;
  ctx.context_len = info.context_len;
  ctx.world = world;
  ctx.gpus_per_node = static_cast<int>(torch::cuda::device_count());
  // device_memory initialises LibTorch's CUDA state first: the allocator cannot be asked before.
  ctx.gpu_bytes = cfg.teacher.gpu_memory.empty()
                      ? compat::device_memory(c10::Device(torch::kCUDA, 0)).total_bytes
                      : parse_size(cfg.teacher.gpu_memory, "teacher.gpu_memory");
  ctx.host_bytes = cfg.teacher.host_memory.empty() ? memory::host_total_bytes()
                                                   : parse_size(cfg.teacher.host_memory, "teacher.host_memory");
  const auto in = make_plan_input(cfg, ctx);
  const auto plan = plan::make_plan(in);
  WD_CHECK_AS(ConfigError, plan.recommended.has_value(),
              "teacher.placement auto: no placement fits " << format_bytes(static_cast<double>(ctx.gpu_bytes))
                                                           << " per GPU and " << format_bytes(static_cast<double>(ctx.host_bytes))
                                                           << " per node: " << plan.reason
                                                           << " (see `wan-distill plan` with the same config)");
  spdlog::info("teacher.placement auto: {} ({}; planned with {} per GPU, {} per node)",
               plan::placement_name(*plan.recommended), plan.reason,
               format_bytes(static_cast<double>(ctx.gpu_bytes)), format_bytes(static_cast<double>(ctx.host_bytes)));
  return *plan.recommended;
}

/// teacher.layout auto (world rank 0): {colocated, teacher ranks, stages, teacher micro-batch}
/// of the fastest layout of `world` ranks for this job: plan::predict_layouts on the job's own
/// teacher forward and student step, timed on the student's device, among the layouts whose
/// global batch divides train.eval_samples and, on a GPU, where a colocated teacher fits beside
/// the student. A resumed run keeps what its first start chose (layout.json in the run
/// directory).
std::vector<std::int64_t> pick_layout(const RunConfig& cfg, int world) {
  const auto saved = fs::path(cfg.run_dir) / "layout.json";
  if (!cfg.checkpoint.resume.empty() && fs::exists(saved)) {
    const auto j = nlohmann::json::parse(std::ifstream(saved));
    spdlog::info("teacher.layout auto: resuming with the layout of the first start ({}): {}", saved.string(),
                 j.at("layout").get<std::string>());
    return {j.at("colocated").get<bool>() ? 1 : 0, j.at("teacher_ranks").get<std::int64_t>(),
            j.at("stages").get<std::int64_t>(), j.value("micro_batch", std::int64_t{0})};
  }
  const auto experts = open_teacher(cfg);
  const auto& ck = experts.expert(0);
  const auto& tc = ck.config();
  const auto info = data::validate_dataset(cfg.data_path(), dataset_expectations(tc));
  const auto device = student::student_device(cfg.student.device, 0);
  compat::set_current_device(device);  // world rank 0 times on its own device
  PlanContext ctx;
  ctx.teacher = tc;
  ctx.stored_elem_bytes = stored_elem_bytes(ck);
  ctx.experts = static_cast<std::int64_t>(experts.size());
  ctx.latent = info.latent_shape;
  ctx.context_len = info.context_len;
  ctx.world = world;
  ctx.cpu_job = device.is_cpu();
  if (device.is_cuda()) {
    ctx.gpus_per_node = static_cast<int>(torch::cuda::device_count());
    ctx.gpu_bytes = cfg.teacher.gpu_memory.empty() ? compat::device_memory(device).total_bytes
                                                   : parse_size(cfg.teacher.gpu_memory, "teacher.gpu_memory");
  }
  ctx.host_bytes = cfg.teacher.host_memory.empty() ? memory::host_total_bytes()
                                                   : parse_size(cfg.teacher.host_memory, "teacher.host_memory");
  const auto in = make_plan_input(cfg, ctx);
  const auto weights = timed_weight_dtype(cfg, ctx.stored_elem_bytes);
  const auto speed = speed_input(cfg, in, tc, weights, info.latent_shape, world, device, -1, 0, 0, "yes");
  const auto layouts = plan::predict_layouts(*speed);
  spdlog::info("teacher.layout auto:\n{}", plan::format_speeds(*speed, layouts));

  // A colocated rank holds the teacher on its GPU beside the student: the `gpu` placement's
  // teacher rank and a student rank on one device.
  std::string colocated_fit;
  if (device.is_cuda()) {
    const auto plan = plan::make_plan(in);
    for (const auto& p : plan.placements) {
      if (p.placement != plan::Placement::kGpu) continue;
      const auto need = p.teacher.device_total() + p.student.device_total();
      if (need > ctx.gpu_bytes) {
        colocated_fit = "the teacher and a student need " + format_bytes(static_cast<double>(need)) + " on one GPU of " +
                        format_bytes(static_cast<double>(ctx.gpu_bytes));
      }
    }
  }
  // Every layout ruled out is named with its reason, faster or slower than the pick: a user
  // who expected it learns why not.
  const bool broadcast = cfg.comm.mode == "broadcast";
  const plan::LayoutSpeed* pick = nullptr;
  for (const auto& l : layouts) {
    const int replicas = l.colocated ? l.students : l.teacher_ranks / l.stages;
    const auto global = cfg.train.batch_size * (broadcast ? replicas : l.students);
    std::string why_not;
    if (cfg.train.eval_samples % global != 0) {
      why_not = "train.eval_samples(" + std::to_string(cfg.train.eval_samples) + ") is not a multiple of its global batch " +
                std::to_string(global);
    } else if (l.colocated && !colocated_fit.empty()) {
      why_not = colocated_fit;
    }
    if (!why_not.empty()) {
      spdlog::info("teacher.layout auto: not {}: {}", l.name, why_not);
    } else if (!pick) {
      pick = &l;  // layouts are fastest first
    }
  }
  if (pick) {
    const auto& l = *pick;
    spdlog::info("teacher.layout auto: {} ({:.2f} samples/s predicted, student wait {:.0f}%)", l.name, l.samples_per_s,
                 100 * l.student_wait);
    std::ofstream(saved) << nlohmann::json{{"layout", l.name}, {"colocated", l.colocated},
                                           {"teacher_ranks", l.teacher_ranks}, {"stages", l.stages},
                                           {"micro_batch", l.micro_batch}, {"flags", plan::layout_flags(l)},
                                           {"samples_per_s", l.samples_per_s}}
                                .dump(2)
                         << "\n";
    return {l.colocated ? 1 : 0, l.teacher_ranks, l.stages, l.micro_batch};
  }
  throw ConfigError("teacher.layout auto: no layout of " + std::to_string(world) + " ranks suits this job (see the "
                    "reasons above); set teacher.ranks and teacher.placement, or change train.eval_samples");
}

/// job.micro_batch from teacher.micro_batch; `auto` is timed on world rank 0 (a teacher, or a
/// colocated student: where the teacher computes) with its threads and device, over the batch a
/// replica computes, and every rank takes that one answer. The answer is kept in the run
/// directory (micro_batch.json): a resumed run slices its batches as the first start did, so
/// its teacher outputs round alike.
void choose_teacher_micro_batch(TrainJob& job) {
  const auto& cfg = job.cfg;
  if (const auto n = cfg.teacher.micro_batch_samples()) {
    job.micro_batch = *n;
    return;
  }
  std::vector<std::int64_t> chosen{0};
  agreed("choosing the teacher micro-batch (teacher.micro_batch auto)", cfg, [&] {
    if (job.world_rank() != 0) return;
    const auto saved = fs::path(cfg.run_dir) / "micro_batch.json";
    if (!cfg.checkpoint.resume.empty() && fs::exists(saved)) {
      chosen[0] = nlohmann::json::parse(std::ifstream(saved)).at("micro_batch").get<std::int64_t>();
      spdlog::info("teacher.micro_batch auto: resuming with the first start's choice ({}): {}", saved.string(),
                   chosen[0]);
      return;
    }
    const auto& ck = job.teacher();
    const auto weights = timed_weight_dtype(cfg, stored_elem_bytes(ck));
    const auto device = job.layout.colocated() ? student::student_device(cfg.student.device, 0)
                                               : teacher::teacher_device(cfg.teacher, job.placement, 0);
    compat::set_current_device(device);
    const auto choice = choose_micro_batch(ck.config(), weights, job.compute, job.plan.latent, job.plan.context_len,
                                           job.per_replica, device);
    spdlog::info("{}", choice.reason);
    chosen[0] = choice.samples;
    std::ofstream(saved) << nlohmann::json{{"micro_batch", choice.samples},
                                           {"seconds_per_sample", choice.seconds_per_sample},
                                           {"batch", job.per_replica}}
                                .dump(2)
                         << "\n";
  });
  comm::broadcast_ints(chosen, 0, MPI_COMM_WORLD, cfg.comm.timeout_s, "teacher micro-batch", nullptr);
  job.micro_batch = chosen[0];
}

/// The checks that need the layout (the held-out set against the global batch, the fault
/// injection's rank and step) and the resume path, added to `p`.
void validate_with_layout(const RunConfig& cfg, const comm::Layout& layout, std::int64_t global_batch,
                          bool broadcast, ConfigProblems& p) {
  p.check(cfg.train.eval_samples % global_batch == 0,
          "train.eval_samples(" + std::to_string(cfg.train.eval_samples) +
              ") must be a multiple of the global batch " + std::to_string(global_batch) +
              " (train.batch_size(" + std::to_string(cfg.train.batch_size) + ") x " +
              std::to_string(broadcast ? layout.replicas : layout.student_ranks) +
              (broadcast ? " replicas" : " students") + ")");
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
  p.check(cfg.checkpoint.resume.empty() || cfg.checkpoint.resume == "auto" || fs::is_directory(cfg.checkpoint.resume),
          "resume(" + cfg.checkpoint.resume + ") must be auto, empty, or an existing checkpoint directory");
}

/// The step training resumes at (the first student looks; it alone opens the store, since
/// opening one clears what crashed saves left), and the checkpoint's path.
void find_resume_point(TrainJob& job) {
  const auto& cfg = job.cfg;
  const int leader = job.layout.student_world_ranks().front();
  std::vector<std::int64_t> resume_step{0};
  agreed("finding the checkpoint to resume from", cfg, [&] {
    if (job.world_rank() != leader) return;
    job.store.emplace(cfg.checkpoint_root(), static_cast<std::size_t>(cfg.checkpoint.keep));
    if (cfg.checkpoint.resume == "auto") {
      if (const auto entry = job.store->latest_good()) {
        resume_step[0] = entry->step;
      } else {
        spdlog::info("resume auto: no good checkpoint in {}; starting at step 0", job.store->root());
      }
    } else if (!cfg.checkpoint.resume.empty()) {
      resume_step[0] = CheckpointStore::verify(cfg.checkpoint.resume).step;
    }
    WD_CHECK_AS(ConfigError, resume_step[0] < cfg.train.steps,
                "the checkpoint to resume from is at step " << resume_step[0] << "; train.steps("
                                                            << cfg.train.steps << ") leaves nothing to train");
  });
  comm::broadcast_ints(resume_step, leader, MPI_COMM_WORLD, cfg.comm.timeout_s, "resume step", nullptr);
  job.plan.first_step = resume_step[0];
  if (resume_step[0] == 0) return;
  job.resume_path = cfg.checkpoint.resume == "auto"
                        ? (fs::path(cfg.checkpoint_root()) / CheckpointStore::dir_name(resume_step[0])).string()
                        : cfg.checkpoint.resume;
  if (job.world_rank() == 0) spdlog::info("resuming from {} (step {})", job.resume_path, resume_step[0]);
}

}  // namespace

void prepare_train(TrainJob& job, comm::MpiRuntime& mpi) {
  const auto& cfg = job.cfg;
  const int rank = mpi.rank();
  // Identical on every rank (same arguments): no communication needed to agree.
  cfg.validate();
  // Roles depend on teacher.ranks and, where each replica can have a node to itself, on the
  // nodes and the replicas' size; the stages wait for the placement (a single replica is always
  // a valid split, so it serves until then, and on several nodes the final layout may move a
  // role: below). teacher.layout auto sets them again once the layout is chosen.
  bool colocated = cfg.teacher.placement == "colocated";
  const auto nodes = gather_node_of_ranks(rank, mpi.size(), cfg.comm.timeout_s);
  const auto roles = [&](const comm::Layout& layout, bool final) {
    job.topo = layout.topology(rank, mpi.local_rank(), mpi.local_size());
    init_logging(job.topo, cfg.log.level);
    if (final) set_threads(cfg, job.topo);
  };
  const auto first_roles = [&] {
    return colocated ? comm::Layout::colocated(mpi.size())
                     : comm::Layout::make(mpi.size(), cfg.teacher.ranks, std::max(1, cfg.teacher.ranks), nodes);
  };
  roles(first_roles(), cfg.teacher.layout != "auto");

  agreed("preparing the run directory", cfg, [&] {
    if (rank != 0) return;
    fs::create_directories(fs::path(cfg.run_dir) / "cache");
    make_builtin_assets(cfg);
  });
  if (cfg.teacher.layout == "auto") {
    // {colocated, teacher ranks, stages}: measured and decided on world rank 0, then every
    // rank takes its role in that layout.
    std::vector<std::int64_t> pick{0, cfg.teacher.ranks, 1, 0};
    agreed("choosing the layout (teacher.layout auto)", cfg, [&] {
      if (rank == 0) pick = pick_layout(cfg, mpi.size());
    });
    comm::broadcast_ints(pick, 0, MPI_COMM_WORLD, cfg.comm.timeout_s, "layout", nullptr);
    colocated = pick[0] != 0;
    auto& teacher = job.cfg.teacher;
    const bool fixed_by_layout = teacher.placement == "colocated" || teacher.placement == "shard";
    teacher.ranks = colocated ? 1 : static_cast<int>(pick[1]);
    teacher.stages = colocated || pick[2] <= 1 ? 0 : static_cast<int>(pick[2]);
    teacher.placement = colocated ? "colocated" : pick[2] > 1 ? "shard" : fixed_by_layout ? "auto" : teacher.placement;
    // The pick's teacher micro-batch, unless one was given as a number of samples.
    if (teacher.micro_batch_samples().value_or(0) == 0) teacher.micro_batch = std::to_string(pick[3]);
    roles(first_roles(), true);
  }
  // {placement, compute dtype (-1: the weights')}: decided once, on world rank 0, so that every
  // rank computes alike.
  std::vector<std::int64_t> chosen{0, -1};
  agreed("choosing the teacher placement", cfg, [&] {
    if (rank != 0) return;
    plan::Placement p = plan::Placement::kCpu;
    c10::Device device(torch::kCPU);
    if (colocated) {  // the teacher lives where the student computes
      device = student::student_device(cfg.student.device, 0);
      p = device.is_cuda() ? plan::Placement::kGpu : plan::Placement::kCpu;
    } else {
      p = cfg.teacher.placement == "auto" ? choose_placement(cfg, mpi.size())
                                          : teacher::parse_placement(cfg.teacher.placement);
      // A placement this build cannot run (gpu without CUDA, a bad teacher.device) stops the
      // job here, before anything is loaded.
      device = teacher::teacher_device(cfg.teacher, p, 0);
    }
    compat::set_current_device(device);
    chosen[0] = static_cast<std::int64_t>(p);
    // teacher.dtype auto keeps each tensor as stored (fp32 islands included): no one dtype to
    // measure, so the matmuls follow the weights.
    const auto weights = teacher_dtype(cfg);
    const auto compute = weights ? teacher::choose_compute(cfg.teacher.compute, *weights, device)
                                 : teacher::ComputeChoice{std::nullopt, "teacher.dtype auto: matmuls in each weight's stored dtype"};
    if (compute.dtype) chosen[1] = static_cast<std::int64_t>(*compute.dtype);
    spdlog::info("{}", compute.reason);
  });
  comm::broadcast_ints(chosen, 0, MPI_COMM_WORLD, cfg.comm.timeout_s, "teacher placement", nullptr);
  job.placement = static_cast<plan::Placement>(chosen[0]);
  if (chosen[1] >= 0) job.compute = static_cast<c10::ScalarType>(chosen[1]);
  job.layout = colocated ? comm::Layout::colocated(mpi.size())
                         : comm::Layout::make(mpi.size(), cfg.teacher.ranks,
                                              teacher::stages_for(cfg.teacher, job.placement), nodes);
  const auto& layout = job.layout;
  if (layout.role_of(rank) != job.topo.role) roles(layout, true);
  log_rank_placement(job.topo, cfg.comm.timeout_s);
  job.groups.emplace(layout, rank);
  if (rank == 0 && colocated) {
    spdlog::info("train: teacher.placement colocated: {} student rank(s), each computing its own targets with "
                 "the teacher on its {} (mapped once per node), no teacher ranks, run dir {}",
                 layout.student_ranks, job.placement == plan::Placement::kGpu ? "GPU" : "host", cfg.run_dir);
  } else if (rank == 0) {
    spdlog::info("train: {} teacher rank(s) ({} replica(s) x {} stage(s), placement {}), {} student rank(s), {}, run dir {}",
                 layout.teacher_ranks, layout.replicas, layout.stages, plan::placement_name(job.placement),
                 layout.student_ranks, layout.placement, cfg.run_dir);
  }

  // Every rank maps the teacher checkpoint (cheap) to learn its config; teachers check data.
  job.broadcast = cfg.comm.mode == "broadcast";
  job.per_replica = cfg.train.batch_size * (job.broadcast ? 1 : layout.students_per_replica());
  const auto global_batch = job.per_replica * layout.replicas;
  agreed("checking the teacher, student and data set", cfg, [&] {
    job.experts = open_teacher(cfg);
    for (const auto& e : job.experts->experts()) e.check();
    if (rank == 0 && job.experts->two_experts()) {
      const auto& ex = *job.experts;
      spdlog::info("teacher {}: two experts, {} for t >= {} and {} below (boundary {})", ex.path(),
                   ex.expert_name(WanExperts::kHigh), ex.boundary_timestep(),
                   ex.expert_name(WanExperts::kLow), ex.boundary());
    }
    const auto& tc = job.teacher().config();
    // Every combination of values that cannot work together, all named in one error.
    ConfigProblems problems;
    validate_with_teacher(cfg, tc, layout.stages, problems);
    validate_with_layout(cfg, layout, global_batch, job.broadcast, problems);
    problems.throw_if_any("train config");
    // A student.device this rank cannot use stops the job here, before anything is loaded.
    if (job.topo.role == Role::kStudent) static_cast<void>(student::student_device(cfg.student.device, job.topo.local_rank));
    if (job.topo.role == Role::kTeacher || layout.colocated()) {  // the ranks that read the data
      job.info = data::validate_dataset(cfg.data_path(), dataset_expectations(tc));
      WD_CHECK_DATA(job.info->samples > cfg.train.eval_samples, job.info->path, "/latents",
                    "has " << job.info->samples << " samples; train.eval_samples(" << cfg.train.eval_samples
                           << ") leaves none for training");
    }
  });

  // World rank 0 (a teacher, or a colocated student) tells everyone the data shapes.
  std::vector<std::int64_t> shape(6, 0);
  if (rank == 0) {
    const auto& lat = job.info->latent_shape;
    shape = {lat[0], lat[1], lat[2], lat[3], job.info->context_len, job.info->samples};
  }
  comm::broadcast_ints(shape, 0, MPI_COMM_WORLD, cfg.comm.timeout_s, "data shape", nullptr);
  job.plan = stream_plan_for(cfg, job.teacher().config(), {shape[0], shape[1], shape[2], shape[3]}, shape[4]);
  job.plan.eval_messages = cfg.train.eval_samples / global_batch;
  job.plan.train_steps = cfg.train.steps;
  job.train_samples = shape[5] - cfg.train.eval_samples;
  choose_teacher_micro_batch(job);
  find_resume_point(job);
}

}  // namespace wd::app
