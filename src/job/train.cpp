// run_train_job: the whole `train` job on this rank once its config is parsed: start-up, the
// role, the run summary, and the failure handler when anything fails on any rank.
#include "job/train.hpp"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "comm/health_channel.hpp"
#include "comm/mpi_runtime.hpp"
#include "comm/signals.hpp"
#include "comm/watchdog.hpp"
#include "core/logging.hpp"
#include "job/failure_handler.hpp"
#include "job/startup.hpp"
#include "job/train_job.hpp"
#include "memory/host_memory.hpp"

namespace wd::job {

namespace {

namespace fs = std::filesystem;

/// Gathers every rank's summary on rank 0, which prints one table and writes summary.json.
void report_run_summary(const RunConfig& cfg, RankSummary mine, double start_rss, int rank, int world,
                        const memory::MemoryMonitor& monitor, comm::HealthChannel& health) {
  mine.start_rss = start_rss;
  mine.peak_rss = static_cast<double>(monitor.lifetime_peak_rss());
  mine.peak_pss = static_cast<double>(monitor.sampled_peak_pss());
  mine.cpu_seconds = memory::cpu_seconds();
  constexpr int kFields = sizeof(RankSummary) / sizeof(double);
  std::vector<RankSummary> all(rank == 0 ? world : 0);
  MPI_Request req;
  WD_CHECK_MPI(MPI_Igather(&mine, kFields, MPI_DOUBLE, all.data(), kFields, MPI_DOUBLE, 0,
                           MPI_COMM_WORLD, &req));
  comm::wait_with_deadline(req, {"gather run summary", -1, sizeof(mine), {0}},
                           std::chrono::duration<double>(cfg.comm.timeout_s), rank, &health);
  if (rank != 0) return;
  nlohmann::json ranks = nlohmann::json::array();
  std::string table =
      "run summary:\n  rank  role     time s   busy %   wait %   samples    CPU s   peak RSS   peak PSS";
  double rss_sum = 0, pss_sum = 0, cpu_sum = 0;
  for (int r = 0; r < world; ++r) {
    const auto& s = all[r];
    const char* role = s.role == 0 ? "teacher" : "student";
    table += fmt::format("\n  {:>4}  {:<7} {:>7.1f} {:>8.0f} {:>8.0f} {:>9.0f} {:>8.1f} {:>10} {:>10}", r, role,
                         s.seconds, 100 * s.busy_fraction, 100 * s.wait_fraction, s.samples, s.cpu_seconds,
                         format_bytes(s.peak_rss), format_bytes(s.peak_pss));
    ranks.push_back({{"rank", r}, {"role", role}, {"seconds", s.seconds},
                     {"busy_fraction", s.busy_fraction}, {"wait_fraction", s.wait_fraction},
                     {"samples", s.samples}, {"cpu_seconds", s.cpu_seconds}, {"peak_rss_bytes", s.peak_rss},
                     {"peak_pss_bytes", s.peak_pss}, {"start_rss_bytes", s.start_rss}});
    rss_sum += s.peak_rss;
    pss_sum += s.peak_pss;
    cpu_sum += s.cpu_seconds;
  }
  // Summed peaks overstate a node's peak (ranks peak at different times); PSS counts pages
  // that ranks share (a mapped teacher) once, RSS once per rank.
  table += fmt::format("\n  all ranks: CPU {:.1f} s, summed peak RSS {}, summed peak PSS {}", cpu_sum,
                       format_bytes(rss_sum), format_bytes(pss_sum));
  spdlog::info("{}", table);
  std::ofstream((fs::path(cfg.run_dir) / "summary.json"))
      << nlohmann::json{{"ranks", ranks},
                        {"cpu_seconds", cpu_sum},
                        {"peak_rss_bytes_sum", rss_sum},
                        {"peak_pss_bytes_sum", pss_sum}}.dump(2)
      << "\n";
}

/// The memory monitor's gather: every rank's MemoryReport to world rank 0 (with deadline).
/// Every rank's memory report of a step, gathered on world rank 0 without holding any rank
/// back: MPI_Igather is posted at the report step and completed later (MPI_Test after each
/// step, a wait with the deadline when the next report is due or the loop is done).
memory::MemoryMonitor::AsyncGather gather_memory_reports(double timeout_s, int rank, int world,
                                                         comm::HealthChannel* health) {
  struct InFlight {
    std::int64_t step = 0;
    memory::MemoryReport mine{};
    std::vector<memory::MemoryReport> all;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  // The buffers stay where MPI was told they are until the gather completes.
  auto flight = std::make_shared<std::unique_ptr<InFlight>>();
  memory::MemoryMonitor::AsyncGather g;
  g.post = [=](std::int64_t step, const memory::MemoryReport& mine) {
    auto f = std::make_unique<InFlight>();
    f->step = step;
    f->mine = mine;
    f->all.resize(rank == 0 ? world : 0);
    // Raw bytes: MemoryReport is trivially copyable and every rank runs the same binary.
    constexpr int kBytes = sizeof(memory::MemoryReport);
    WD_CHECK_MPI(MPI_Igather(&f->mine, kBytes, MPI_BYTE, f->all.data(), kBytes, MPI_BYTE, 0, MPI_COMM_WORLD,
                             &f->request));
    *flight = std::move(f);
  };
  g.collect = [=](bool wait) -> std::optional<memory::MemoryMonitor::Gathered> {
    auto& f = *flight;
    if (!f) return std::nullopt;
    if (wait) {
      std::vector<int> peers;
      if (rank == 0) {
        for (int r = 1; r < world; ++r) peers.push_back(r);
      } else {
        peers.push_back(0);
      }
      comm::wait_with_deadline(f->request, {"gather memory report", f->step, sizeof(f->mine), peers},
                               std::chrono::duration<double>(timeout_s), rank, health);
    } else {
      int done = 0;
      WD_CHECK_MPI(MPI_Test(&f->request, &done, MPI_STATUS_IGNORE));
      if (!done) return std::nullopt;
    }
    memory::MemoryMonitor::Gathered out{f->step, std::move(f->all)};
    f.reset();
    return out;
  };
  return g;
}

/// The resolved teacher placement as the remedies compare it (teacher.placement's enum).
TeacherPlacement placement_choice(plan::Placement p) {
  switch (p) {
    case plan::Placement::kGpu: return TeacherPlacement::kGpu;
    case plan::Placement::kCpu: return TeacherPlacement::kCpu;
    case plan::Placement::kStream: return TeacherPlacement::kStream;
    case plan::Placement::kShard: return TeacherPlacement::kShard;
  }
  return TeacherPlacement::kCpu;
}

/// The larger student.sequence_parallel sizes the diagnosis may offer: those check_sequence_parallel
/// would take for this job (the same layout, teacher and student), smallest first.
std::vector<std::int64_t> sequence_parallel_remedies(const TrainJob& job) {
  std::vector<std::int64_t> sizes;
  if (!job.experts) return sizes;
  const auto heads = job.cfg.student.lora_rank > 0 ? job.model.num_heads : job.cfg.student.model_config(job.model).num_heads;
  for (std::int64_t g = job.cfg.student.sequence_parallel + 1; g <= heads; ++g) {
    auto cfg = job.cfg;
    cfg.student.sequence_parallel = g;
    try {
      check_sequence_parallel(cfg, &*job.experts, job.layout);
      sizes.push_back(g);
    } catch (const ConfigError&) {  // this size does not fit the job: not a remedy
    }
  }
  return sizes;
}

/// What the failure handler needs besides the exception: the remedies' config values, the
/// deadline, where the diagnosis goes.
FailureSetup failure_setup_for(const TrainJob& job) {
  const auto& cfg = job.cfg;
  FailureSetup setup;
  setup.remedies = {cfg.teacher.dtype, cfg.student.checkpointing, cfg.student.precision,
                    cfg.train.batch_size, cfg.train.grad_accum, cfg.train.lr, cfg.train.grad_clip,
                    cfg.comm.timeout_s,
                    cfg.checkpoint.every > 0 || !cfg.checkpoint.resume.empty()
                        ? "checkpoints in " + cfg.checkpoint_root() : "",
                    job.args, placement_choice(job.placement),
                    job.layout.teacher_ranks,
                    job.layout.stages, cfg.teacher.stream_ahead, cfg.student.shard, job.layout.student_ranks};
  // A colocated teacher holds both experts whichever the students train: one job per expert frees nothing.
  setup.remedies.lora_pair = job.lora_pair() && !job.layout.colocated();
  setup.remedies.sequence_parallel = cfg.student.sequence_parallel;
  setup.remedies.sequence_parallel_sizes = sequence_parallel_remedies(job);
  setup.timeout_s = cfg.comm.timeout_s;
  setup.diagnosis_path = (fs::path(cfg.run_dir) / "diagnosis.txt").string();
  for (int r = 0; r < job.layout.world_size; ++r) setup.roles.push_back(job.layout.role_of(r));
  return setup;
}

}  // namespace

int run_train_job(TrainJob& job) {
  comm::MpiRuntime mpi(nullptr, nullptr);
  const int rank = mpi.rank();
  comm::install_signal_handlers();
  // Live from the start of training to the end of the failure handler (declared out here so
  // the handler runs after the stack of the failed step unwound).
  std::optional<comm::HealthChannel> health;
  std::optional<comm::Watchdog> watchdog;
  FailureSetup failure_setup;
  RankMemory rank_memory;
  try {
    start_train(job, mpi);
    const auto start_rss = static_cast<double>(memory::host_memory().rss_bytes);
    const auto& cfg = job.cfg;
    failure_setup = failure_setup_for(job);
    health.emplace(MPI_COMM_WORLD, job.topo);
    // A step may take up to the deadline; past twice that plus the failure protocol's own
    // waits (the default limit), the main thread is stuck where it cannot poll.
    watchdog.emplace(*health, cfg.comm.watchdog_limit(), exit_code(FailureKind::kPeerLost));
    const bool teacher = job.topo.role == Role::kTeacher;
    const FaultInjector faults(FaultSpec::parse(cfg.inject_fault), job.topo.role,
                               teacher ? job.layout.teacher_index(rank) : job.layout.student_index(rank));
    // World rank 0 prints the memory table and writes its metrics.jsonl line (docs/memory.md).
    memory::MemoryMonitor monitor(cfg.memory, job.topo.role, gather_memory_reports(cfg.comm.timeout_s, rank, mpi.size(), &*health),
                                  rank == 0 ? (fs::path(cfg.run_dir) / "metrics.jsonl").string() : "");
    RoleServices services{*health, monitor, faults, rank_memory};
    const auto result = teacher ? run_teacher_rank(job, services) : run_student_rank(job, services);
    if (result.requeue) {
      // Nobody leaves before the checkpoint is written (an early non-zero exit makes mpirun
      // stop the rest). A teacher may have abandoned a collective on the world communicator
      // when the stop reached it, so the meeting point is the health channel's own.
      health->barrier("requeue barrier", cfg.comm.timeout_s);
      spdlog::info("exiting with code {} (requeue: resume with --resume auto)", kExitRequeue);
      watchdog.reset();
      mpi.exit_without_finalize(kExitRequeue);
    }
    monitor.finish();
    report_run_summary(cfg, result.summary, start_rss, rank, mpi.size(), monitor, *health);
    return kExitOk;
  } catch (...) {
    if (health) {
      // Training had started: every rank learns of the failure through the health channel,
      // rank 0 (or the lowest rank still answering) explains, every rank exits alike.
      memory::release_free_host_memory();  // what the failed step held is free now: let RSS show it
      auto report = memory::measure_memory(job.topo.role, rank_memory.device, rank_memory.model);
      report.teacher_weights_bytes = rank_memory.teacher_weights_bytes;
      report.transport_bytes = rank_memory.transport_bytes;
      handle_training_failure(std::current_exception(), *health, mpi, failure_setup, report);
    }
    // Before training every failure is agreed by all ranks: rank 0 explains, all exit alike,
    // and rank 0 tells launch/mpirun.sh the code (so it need not wait out mpirun's kill grace).
    if (rank != 0) return exit_code_of(std::current_exception());
    const int code = report_failure("train", std::current_exception());
    if (const char* status = std::getenv("WD_LAUNCH_STATUS"); status != nullptr && *status != '\0') {
      std::ofstream(status) << code << "\n";
    }
    return code;
  }
}

}  // namespace wd::job
