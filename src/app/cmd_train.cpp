// `wan-distill train`: the distillation job. Teacher ranks stream, student ranks train.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/commands.hpp"
#include "app/failure_handler.hpp"
#include "app/plan_input.hpp"
#include "model/wan_experts.hpp"
#include "app/rank_placement.hpp"
#include "app/run_config.hpp"
#include "comm/health.hpp"
#include "core/fault_injection.hpp"
#include "comm/mpi_runtime.hpp"
#include "comm/startup.hpp"
#include "comm/transport_factory.hpp"
#include "core/logging.hpp"
#include "core/torch_compat.hpp"
#include "memory/planner.hpp"
#include "model/safetensors.hpp"
#include "data/data_config.hpp"
#include "memory/memory_monitor.hpp"
#include "student/student_loop.hpp"
#include "student/student_model.hpp"
#include "student/student_parts.hpp"
#include "student/train_state.hpp"
#include "core/checkpoint_store.hpp"
#include "teacher/teacher_config.hpp"
#include "teacher/placement.hpp"
#include "teacher/teacher_loop.hpp"
#include "teacher/teacher_stage.hpp"

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
  comm::agree_on_startup(stage, failure, MPI_COMM_WORLD, cfg.comm.timeout_s);
}

/// Generates the builtin:tiny teacher and data set when missing (world rank 0 only).
void make_builtin_assets(const RunConfig& cfg) {
  if (cfg.teacher.checkpoint == kBuiltin && !fs::exists(fs::path(cfg.teacher_path()) / "config.json")) {
    spdlog::info("generating the builtin tiny teacher in {}", cfg.teacher_path());
    write_random_wan_checkpoint(cfg.teacher_path(), WanConfig::preset("tiny"), torch::kBFloat16,
                                2'000'000'000ULL, kBuiltinSeed);
  }
  if (cfg.data.path == kBuiltin && !fs::exists(cfg.data_path())) {
    const auto tc = WanCheckpoint::open(cfg.teacher_path(), cfg.teacher.model_config).config();
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

std::int64_t tokens_per_sample(const WanConfig& c, const std::array<std::int64_t, 4>& latent) {
  return (latent[1] / c.patch_size[0]) * (latent[2] / c.patch_size[1]) * (latent[3] / c.patch_size[2]);
}

/// What each rank reports at the end of a run.
struct RankSummary {
  double role = 0;  ///< 0 teacher, 1 student
  double seconds = 0;
  double busy_fraction = 0;  ///< teacher: reading + noising + forward
  double wait_fraction = 0;  ///< blocked in the transport
  double samples = 0;
  double peak_rss = 0;
};

/// Gathers every rank's summary on rank 0, which prints one table and writes summary.json.
void report_run_summary(const RunConfig& cfg, RankSummary mine, int rank, int world,
                        const memory::MemoryMonitor& monitor) {
  mine.peak_rss = static_cast<double>(monitor.lifetime_peak_rss());
  constexpr int kFields = sizeof(RankSummary) / sizeof(double);
  std::vector<RankSummary> all(rank == 0 ? world : 0);
  MPI_Request req;
  WD_CHECK_MPI(MPI_Igather(&mine, kFields, MPI_DOUBLE, all.data(), kFields, MPI_DOUBLE, 0,
                           MPI_COMM_WORLD, &req));
  comm::wait_with_deadline(req, {"gather run summary", -1, sizeof(mine), {0}},
                           std::chrono::duration<double>(cfg.comm.timeout_s), rank);
  if (rank != 0) return;
  nlohmann::json ranks = nlohmann::json::array();
  std::string table = "run summary:\n  rank  role     time s   busy %   wait %   samples   peak RSS";
  for (int r = 0; r < world; ++r) {
    const auto& s = all[r];
    const char* role = s.role == 0 ? "teacher" : "student";
    table += fmt::format("\n  {:>4}  {:<7} {:>7.1f} {:>8.0f} {:>8.0f} {:>9.0f} {:>10}", r, role,
                         s.seconds, 100 * s.busy_fraction, 100 * s.wait_fraction, s.samples,
                         format_bytes(s.peak_rss));
    ranks.push_back({{"rank", r}, {"role", role}, {"seconds", s.seconds},
                     {"busy_fraction", s.busy_fraction}, {"wait_fraction", s.wait_fraction},
                     {"samples", s.samples}, {"peak_rss_bytes", s.peak_rss}});
  }
  spdlog::info("{}", table);
  std::ofstream((fs::path(cfg.run_dir) / "summary.json")) << nlohmann::json{{"ranks", ranks}}.dump(2) << "\n";
}

/// The memory monitor's gather: every rank's MemoryReport to world rank 0 (with deadline).
memory::MemoryMonitor::Gather gather_memory_reports(double timeout_s, int rank, int world) {
  return [=](std::int64_t step, const memory::MemoryReport& mine) {
    std::vector<memory::MemoryReport> all(rank == 0 ? world : 0);
    // Raw bytes: MemoryReport is trivially copyable and every rank runs the same binary.
    constexpr int kBytes = sizeof(memory::MemoryReport);
    MPI_Request req;
    WD_CHECK_MPI(MPI_Igather(&mine, kBytes, MPI_BYTE, all.data(), kBytes, MPI_BYTE, 0,
                             MPI_COMM_WORLD, &req));
    std::vector<int> peers;
    if (rank == 0) {
      for (int r = 1; r < world; ++r) peers.push_back(r);
    } else {
      peers.push_back(0);
    }
    comm::wait_with_deadline(req, {"gather memory report", step, sizeof(mine), peers},
                             std::chrono::duration<double>(timeout_s), rank);
    return all;
  };
}

void set_threads(const RunConfig& cfg, int local_size) {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = cfg.runtime.threads > 0 ? cfg.runtime.threads : std::max(1, hw / local_size);
  torch::set_num_threads(threads);
  spdlog::debug("{} intra-op thread(s)", threads);
}

/// MemTotal of /proc/meminfo (0 when unreadable).
std::uint64_t host_memory_total() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  while (in >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024;
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

/// teacher.placement = auto: what the planner recommends for this job, with the memory the
/// config gives or that is detected (rank 0 only; it reads the data set's shapes).
memory::Placement choose_placement(const RunConfig& cfg, int world) {
  if (!compat::cuda_available()) {
    spdlog::info("teacher.placement auto: cpu (this LibTorch has no CUDA, so the teacher computes on the host)");
    return memory::Placement::kCpu;
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
  ctx.gpu_bytes = cfg.teacher.gpu_memory.empty()
                      ? compat::device_memory(c10::Device(torch::kCUDA, 0)).total_bytes
                      : parse_size(cfg.teacher.gpu_memory, "teacher.gpu_memory");
  ctx.host_bytes = cfg.teacher.host_memory.empty() ? host_memory_total()
                                                   : parse_size(cfg.teacher.host_memory, "teacher.host_memory");
  const auto in = make_plan_input(cfg, ctx);
  const auto plan = memory::make_plan(in);
  WD_CHECK_AS(ConfigError, plan.recommended.has_value(),
              "teacher.placement auto: no placement fits " << format_bytes(static_cast<double>(ctx.gpu_bytes))
                                                           << " per GPU and " << format_bytes(static_cast<double>(ctx.host_bytes))
                                                           << " per node: " << plan.reason
                                                           << " (see `wan-distill plan` with the same config)");
  spdlog::info("teacher.placement auto: {} ({}; planned with {} per GPU, {} per node)",
               memory::placement_name(*plan.recommended), plan.reason,
               format_bytes(static_cast<double>(ctx.gpu_bytes)), format_bytes(static_cast<double>(ctx.host_bytes)));
  return *plan.recommended;
}

/// Bytes of one teacher block and of the head (what only the last stage holds), as stored.
std::pair<std::vector<std::uint64_t>, std::uint64_t> block_bytes_of(const WanCheckpoint& ck) {
  const auto& c = ck.config();
  std::vector<std::uint64_t> blocks(static_cast<std::size_t>(c.num_layers), 0);
  std::uint64_t head = 0;
  for (const auto& spec : wan_param_specs(c)) {
    const auto b = wan_block_of(spec.name);
    if (b >= 0) blocks[static_cast<std::size_t>(b)] += ck.info(spec.name).nbytes();
    if (spec.name.rfind("head.", 0) == 0) head += ck.info(spec.name).nbytes();
  }
  return {blocks, head};
}

}  // namespace

int run_train(const std::vector<std::string>& args) {
  RunConfig cfg;
  OptionTable table("train options (INI sections: [teacher] placement = ... is --teacher.placement)");
  cfg.bind(table);
  bool print_config = false;
  table.bind("print-config", print_config, "print the effective config as INI and exit (no MPI)");
  if (parse_options(args, table).help) {
    print_help("mpirun -np N wan-distill train [--config FILE] [--run-dir DIR] [--section.key value ...]",
               "Distils the teacher into the student. World ranks 0..teacher.ranks-1 are teachers, the\n"
               "rest students. Without --config it runs the builtin tiny job (configs/tiny.ini).",
               table);
    return kExitOk;
  }
  if (print_config) {
    cfg.validate();
    print_config = false;  // not part of the printed file
    std::cout << table.to_ini();
    return kExitOk;
  }
  comm::MpiRuntime mpi(nullptr, nullptr);
  const int rank = mpi.rank();
  comm::install_signal_handlers();
  // Live from the start of training to the end of the failure handler (declared out here so
  // the handler runs after the stack of the failed step unwound).
  std::optional<comm::HealthChannel> health;
  std::optional<comm::Watchdog> watchdog;
  FailureSetup failure_setup;
  memory::MemoryReport failure_memory;  // the categories counted before a failure
  memory::ModelMemory tracked_model;
  c10::Device device = torch::kCPU;
  try {
    // Identical on every rank (same arguments): no communication needed to agree.
    cfg.validate();
    // Roles depend on teacher.ranks alone; the replicas and stages wait for the placement (a
    // single replica is always a valid split, so it serves until then).
    const auto topo = comm::Layout::make(mpi.size(), cfg.teacher.ranks, std::max(1, cfg.teacher.ranks))
                          .topology(rank, mpi.local_rank(), mpi.local_size());
    init_logging(topo, cfg.log.level);
    set_threads(cfg, mpi.local_size());
    log_rank_placement(topo, cfg.comm.timeout_s);

    agreed("preparing the run directory", cfg, [&] {
      if (rank == 0) {
        fs::create_directories(fs::path(cfg.run_dir) / "cache");
        make_builtin_assets(cfg);
      }
    });
    std::vector<std::int64_t> chosen{0};
    agreed("choosing the teacher placement", cfg, [&] {
      if (rank != 0) return;
      const auto p = cfg.teacher.placement == "auto" ? choose_placement(cfg, mpi.size())
                                                     : teacher::parse_placement(cfg.teacher.placement);
      // A placement this build cannot run (gpu without CUDA, a bad teacher.device) stops the
      // job here, before anything is loaded.
      static_cast<void>(teacher::teacher_device(cfg.teacher, p, 0));
      chosen[0] = static_cast<std::int64_t>(p);
    });
    comm::broadcast_ints(chosen, 0, MPI_COMM_WORLD, cfg.comm.timeout_s, "teacher placement");
    const auto placement = static_cast<memory::Placement>(chosen[0]);
    const auto layout = comm::Layout::make(mpi.size(), cfg.teacher.ranks, teacher::stages_for(cfg.teacher, placement));
    comm::ProcessGroups groups(layout, rank);
    if (rank == 0) {
      spdlog::info("train: {} teacher rank(s) ({} replica(s) x {} stage(s), placement {}), {} student rank(s), run dir {}",
                   layout.teacher_ranks, layout.replicas, layout.stages, memory::placement_name(placement),
                   layout.student_ranks, cfg.run_dir);
    }

    // Every rank maps the teacher checkpoint (cheap) to learn its config; teachers check data.
    std::optional<WanExperts> experts;
    const WanCheckpoint* ck = nullptr;  // the first expert (the only one of a dense teacher)
    std::optional<data::DatasetInfo> info;
    const bool broadcast = cfg.comm.mode == "broadcast";
    const auto per_replica = cfg.train.batch_size * (broadcast ? 1 : layout.students_per_replica());
    const auto global_batch = per_replica * layout.replicas;
    agreed("checking the teacher, student and data set", cfg, [&] {
      experts = open_teacher(cfg);
      for (const auto& e : experts->experts()) e.check();
      ck = &experts->expert(0);
      if (rank == 0 && experts->two_experts()) {
        spdlog::info("teacher {}: two experts, {} for t >= {} and {} below (boundary {})", experts->path(),
                     experts->expert_name(WanExperts::kHigh), experts->boundary_timestep(),
                     experts->expert_name(WanExperts::kLow), experts->boundary());
      }
      const auto& tc = ck->config();
      WD_CHECK_AS(ConfigError, tc.model_type != "i2v",
                  "teacher " << cfg.teacher_path() << " is an i2v model; its image conditioning "
                             "is not in the data schema yet (t2v and ti2v teachers are supported)");
      const auto sc = cfg.student.model_config(tc);
      sc.validate("student config");
      // Every combination of values that cannot work together, all named in one error.
      ConfigProblems p;
      for (const auto& [s, t] : cfg.student.feature_pairs()) {
        p.check(s < sc.num_layers && t < tc.num_layers,
                "student.features(" + cfg.student.features + ") pairs student block " + std::to_string(s) +
                    " with teacher block " + std::to_string(t) + "; the student has " +
                    std::to_string(sc.num_layers) + " blocks, the teacher " + std::to_string(tc.num_layers));
      }
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
      }
      p.check(cfg.checkpoint.every <= cfg.train.steps,
              "checkpoint.every(" + std::to_string(cfg.checkpoint.every) + ") exceeds train.steps(" +
                  std::to_string(cfg.train.steps) + "): no checkpoint would be written before the end");
      p.check(layout.stages <= tc.num_layers,
              "teacher.stages(" + std::to_string(layout.stages) + ") exceeds the teacher's " +
                  std::to_string(tc.num_layers) + " blocks (each stage needs one at least)");
      if (!cfg.teacher.shard_map.empty()) {
        try {
          teacher::stage_ranges(cfg.teacher, layout.stages, block_bytes_of(*ck).first, 0);
        } catch (const ConfigError& e) {
          p.check(false, e.what());
        }
      }
      p.check(cfg.checkpoint.resume.empty() || cfg.checkpoint.resume == "auto" || fs::is_directory(cfg.checkpoint.resume),
              "resume(" + cfg.checkpoint.resume + ") must be auto, empty, or an existing checkpoint directory");
      p.throw_if_any("train config");
      if (topo.role == Role::kTeacher) {
        info = data::validate_dataset(cfg.data_path(), dataset_expectations(tc));
        WD_CHECK_DATA(info->samples > cfg.train.eval_samples, info->path, "/latents",
                      "has " << info->samples << " samples; train.eval_samples(" << cfg.train.eval_samples
                             << ") leaves none for training");
      }
    });

    // World rank 0 (a teacher) tells everyone the data shapes.
    std::vector<std::int64_t> shape(6, 0);
    if (rank == 0) {
      shape = {info->latent_shape[0], info->latent_shape[1], info->latent_shape[2],
               info->latent_shape[3], info->context_len, info->samples};
    }
    comm::broadcast_ints(shape, 0, MPI_COMM_WORLD, cfg.comm.timeout_s, "data shape");
    // Where training resumes: the first student rank looks (it alone owns the store, since
    // opening one clears what crashed saves left) and tells every rank the step.
    const int leader = layout.teacher_ranks;
    std::optional<CheckpointStore> store;
    std::vector<std::int64_t> resume_step{0};
    agreed("finding the checkpoint to resume from", cfg, [&] {
      if (rank != leader) return;
      store.emplace(cfg.checkpoint_root(), static_cast<std::size_t>(cfg.checkpoint.keep));
      if (cfg.checkpoint.resume == "auto") {
        if (const auto entry = store->latest_good()) {
          resume_step[0] = entry->step;
        } else {
          spdlog::info("resume auto: no good checkpoint in {}; starting at step 0", store->root());
        }
      } else if (!cfg.checkpoint.resume.empty()) {
        resume_step[0] = CheckpointStore::verify(cfg.checkpoint.resume).step;
      }
      WD_CHECK_AS(ConfigError, resume_step[0] < cfg.train.steps,
                  "the checkpoint to resume from is at step " << resume_step[0] << "; train.steps("
                                                              << cfg.train.steps << ") leaves nothing to train");
    });
    comm::broadcast_ints(resume_step, leader, MPI_COMM_WORLD, cfg.comm.timeout_s, "resume step");
    std::string resume_path;
    if (resume_step[0] > 0) {
      resume_path = cfg.checkpoint.resume == "auto"
                        ? (fs::path(cfg.checkpoint_root()) / CheckpointStore::dir_name(resume_step[0])).string()
                        : cfg.checkpoint.resume;
      if (rank == 0) spdlog::info("resuming from {} (step {})", resume_path, resume_step[0]);
    }

    const auto& tc = ck->config();
    comm::StreamPlan plan;
    plan.batch_per_student = cfg.train.batch_size;
    plan.eval_messages = cfg.train.eval_samples / global_batch;
    plan.train_steps = cfg.train.steps;
    plan.first_step = resume_step[0];
    plan.micro_batches = cfg.train.grad_accum;
    plan.latent = {shape[0], shape[1], shape[2], shape[3]};
    plan.out_channels = tc.out_dim;
    plan.context_len = shape[4];
    plan.text_dim = tc.text_dim;
    plan.per_token_seq_len = tc.model_type == "ti2v" ? tokens_per_sample(tc, plan.latent) : 0;
    for (const auto& pair : cfg.student.feature_pairs()) plan.feature_blocks.push_back(pair.second);
    std::sort(plan.feature_blocks.begin(), plan.feature_blocks.end());
    plan.feature_blocks.erase(std::unique(plan.feature_blocks.begin(), plan.feature_blocks.end()),
                              plan.feature_blocks.end());
    plan.tokens = tokens_per_sample(tc, plan.latent);
    plan.teacher_dim = tc.dim;
    const auto train_samples = shape[5] - cfg.train.eval_samples;
    // Every student, and the last stage of each teacher replica, is on a teacher -> students link.
    std::unique_ptr<comm::Transport> transport;
    if (groups.link() != MPI_COMM_NULL) {
      // Students train on the host (no student GPU placement yet), so the link carries host
      // tensors over MPI; a CUDA teacher's output is brought to the host by the transport.
      transport = comm::make_transport(groups, rank, plan.message_spec(), cfg.comm, 0, plan.end_step(), torch::kCPU);
    }

    failure_setup.remedies = {cfg.teacher.dtype, cfg.student.checkpointing, cfg.student.precision,
                              cfg.train.batch_size, cfg.train.grad_accum, cfg.train.lr, cfg.train.grad_clip,
                              cfg.comm.timeout_s,
                              cfg.checkpoint.every > 0 || !cfg.checkpoint.resume.empty()
                                  ? "checkpoints in " + cfg.checkpoint_root() : "",
                              args, memory::placement_name(placement), layout.teacher_ranks,
                              layout.stages, cfg.teacher.stream_ahead};
    failure_setup.timeout_s = cfg.comm.timeout_s;
    failure_setup.diagnosis_path = (fs::path(cfg.run_dir) / "diagnosis.txt").string();
    failure_setup.teacher_ranks = layout.teacher_ranks;
    failure_memory.role = topo.role;
    failure_memory.transport_bytes = plan.message_spec().bytes() * static_cast<std::uint64_t>(cfg.comm.prefetch_depth) *
                                     static_cast<std::uint64_t>(topo.role == Role::kTeacher ? layout.students_per_replica() : 1);
    health.emplace(MPI_COMM_WORLD, topo);
    // A step may take up to the deadline; past twice that plus the failure protocol's own
    // waits (the default limit), the main thread is stuck where it cannot poll.
    watchdog.emplace(*health, cfg.comm.watchdog_limit(), exit_code(FailureKind::kPeerLost));
    const int role_rank = topo.role == Role::kTeacher ? rank : rank - layout.teacher_ranks;
    const FaultInjector faults(FaultSpec::parse(cfg.inject_fault), topo.role, role_rank);
    RankSummary summary;
    bool requeue = false;  // stopped after SIGUSR1 with a checkpoint written
    // World rank 0 prints the memory table and writes its metrics.jsonl line (docs/memory.md).
    memory::MemoryMonitor monitor(
        cfg.memory, topo.role, gather_memory_reports(cfg.comm.timeout_s, rank, mpi.size()),
        rank == 0 ? (fs::path(cfg.run_dir) / "metrics.jsonl").string() : "");
    if (topo.role == Role::kTeacher) {
      const auto [block_bytes, head_bytes] = block_bytes_of(*ck);
      const auto ranges = teacher::stage_ranges(cfg.teacher, layout.stages, block_bytes, head_bytes);
      const int stage = layout.stage_of(rank);
      teacher::StageLoad how;
      how.placement = placement;
      how.dtype = teacher_dtype(cfg);
      how.device = teacher::teacher_device(cfg.teacher, placement, topo.local_rank);
      how.blocks = ranges[static_cast<std::size_t>(stage)];
      how.stream_ahead = cfg.teacher.stream_ahead;
      how.timeout_s = cfg.comm.timeout_s;
      if (layout.stages > 1) {
        spdlog::info("teacher stage {}/{} of replica {}: blocks {}-{} on {}", stage + 1, layout.stages,
                     layout.replica_of(rank), how.blocks.begin, how.blocks.end - 1, how.device.str());
      }
      std::vector<teacher::StageModel> models;
      for (const auto& e : experts->experts()) {
        models.push_back(teacher::load_stage_model(e, how));
        failure_memory.teacher_weights_bytes += teacher::stage_weight_bytes(models.back());
      }
      device = how.device;
      teacher::Router router;
      if (experts->two_experts()) {
        router = [&experts](const torch::Tensor& t) { return experts->route(t); };
      }
      teacher::TeacherStage stage_model(std::move(models), router, how.blocks, plan.feature_blocks);
      const auto per_stage_spec = [&](int s) {
        return teacher::stage_message_spec(plan, per_replica,
                                           teacher::TeacherStage::features_before(plan.feature_blocks,
                                                                                  ranges[static_cast<std::size_t>(s)].end));
      };
      comm::StageTransports links;
      if (layout.stages > 1) {
        links = comm::make_mpi_stage_transports(groups, rank, per_stage_spec(std::max(0, stage - 1)),
                                                per_stage_spec(stage), cfg.comm, 0, plan.end_step());
      }
      std::optional<data::DatasetReader> reader;
      if (stage == 0) reader.emplace(*info);
      data::SampleSchedule schedule(train_samples, per_replica, layout.replicas, cfg.train.seed);
      data::FlowMatchingNoiser noiser(cfg.noise, cfg.train.seed);
      data::FlowMatchingNoiser eval_noiser(cfg.noise, cfg.train.seed ^ 0xE7A1ULL);
      teacher::TeacherJob job{stage_model, reader ? &*reader : nullptr, schedule, noiser, eval_noiser,
                              transport.get(), plan, layout.replica_of(rank), layout.replicas,
                              layout.students_per_replica(), train_samples, broadcast};
      job.memory = &monitor;
      job.health = &*health;
      job.faults = &faults;
      job.from_previous = links.from_previous.get();
      job.to_next = links.to_next.get();
      const auto stats = teacher::run_teacher(job);
      requeue = stats.stopped_after >= 0;
      summary = {0, stats.seconds, stats.busy_seconds / stats.seconds,
                 stats.wait_seconds / stats.seconds, static_cast<double>(stats.samples), 0};
    } else {
      student::PartsSetup setup;
      setup.teacher_in_channels = plan.latent[0];
      setup.teacher_out_channels = plan.out_channels;
      setup.teacher_dim = tc.dim;
      setup.feature_pairs = cfg.student.feature_pairs();
      setup.feature_weight = cfg.student.feature_weight;
      setup.train_projections = cfg.student.projection == "trained";
      setup.mixed_bf16 = cfg.student.precision == "bf16-mixed";
      setup.seed = cfg.train.seed;
      // Everything the student trains is created here, once; the loop creates nothing.
      student::StudentParts parts(
          student::build_student(cfg.student.model_config(tc), cfg.student, *ck, cfg.train.seed), setup);
      int group_rank = 0;
      WD_CHECK_MPI(MPI_Comm_rank(groups.students(), &group_rank));
      comm::GradientReducer reducer(groups.students(), parts.trainable(),
                                    cfg.comm.bucket_bytes(),
                                    cfg.comm.timeout_s, rank);
      std::vector<int> peers;
      for (int r = layout.teacher_ranks; r < layout.world_size; ++r) {
        if (r != rank) peers.push_back(r);
      }
      student::StudentJob job{parts, *transport, reducer, plan, cfg.train, groups.students(),
                              cfg.comm.timeout_s, rank, peers, group_rank == 0,
                              (fs::path(cfg.run_dir) / "metrics.jsonl").string(),
                              student::CheckpointPolicy::parse(cfg.student.checkpointing)};
      job.memory = &monitor;
      job.health = &*health;
      job.faults = &faults;
      job.teachers.clear();
      for (int r = 0; r < layout.teacher_ranks; ++r) job.teachers.push_back(r);
      job.tracked_memory = &tracked_model;
      job.checkpoint_every = cfg.checkpoint.every;
      if (!resume_path.empty()) {
        job.restore = [&](torch::optim::AdamW& optimizer) {
          const auto cursor = student::load_train_state(resume_path, parts, optimizer);
          WD_CHECK_DATA(cursor.step == plan.first_step, resume_path, "trainer.json",
                        "step " << cursor.step << " differs from the manifest's step " << plan.first_step);
        };
      }
      const std::string config_ini = table.to_ini();
      job.save = [&](std::int64_t step, torch::optim::AdamW& optimizer) {
        if (!store) return;  // the first student writes; every replica holds the same state
        const auto path = store->save(step, [&](const std::string& dir) {
          student::save_train_state(dir, parts, optimizer, {step}, config_ini);
        });
        spdlog::info("checkpoint of step {} written to {}", step, path);
      };
      device = parts.trainable().front().device();
      tracked_model.weights_bytes = memory::tensor_bytes(parts.trainable());
      const auto stats = student::run_student(job);
      requeue = stats.stopped_after >= 0;
      summary = {1, stats.seconds, 1 - stats.wait_seconds / stats.seconds,
                 stats.wait_seconds / stats.seconds,
                 static_cast<double>((plan.train_steps - plan.first_step) * plan.micro_batches *
                                     plan.batch_per_student), 0};
      if (group_rank == 0 && !requeue) {
        const auto dir = (fs::path(cfg.run_dir) / "student").string();
        parts.save(dir);
        spdlog::info("student saved to {} ({} params); held-out relative MSE {:.5f} -> {:.5f}; "
                     "{:.1f} s, waiting for batches {:.0f}%",
                     dir, wan_param_count(parts.model()->config()), stats.first_eval_rel_mse,
                     stats.final_eval_rel_mse, stats.seconds, 100 * stats.wait_seconds / stats.seconds);
      }
    }
    transport.reset();
    if (requeue) {
      // Nobody leaves before the checkpoint is written (an early non-zero exit makes mpirun
      // stop the rest). A teacher may have abandoned a collective on the world communicator
      // when the stop reached it, so the meeting point is the health channel's own.
      health->barrier("requeue barrier", cfg.comm.timeout_s);
      spdlog::info("exiting with code {} (requeue: resume with --resume auto)", kExitRequeue);
      watchdog.reset();
      mpi.exit_without_finalize(kExitRequeue);
    }
    report_run_summary(cfg, summary, rank, mpi.size(), monitor);
    return kExitOk;
  } catch (...) {
    if (health) {
      // Training had started: every rank learns of the failure through the health channel,
      // rank 0 (or the lowest rank still answering) explains, every rank exits alike.
      auto report = memory::measure_memory(failure_memory.role, device, tracked_model);
      report.teacher_weights_bytes = failure_memory.teacher_weights_bytes;
      report.transport_bytes = failure_memory.transport_bytes;
      handle_training_failure(std::current_exception(), *health, mpi, failure_setup, report);
    }
    // Before training every failure is agreed by all ranks: rank 0 explains, all exit alike.
    if (rank == 0) return report_failure("train", std::current_exception());
    return exit_code_of(std::current_exception());
  }
}

}  // namespace wd::app
