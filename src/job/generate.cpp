// run_generate_job: `generate`'s start-up (train's, every rank holding a whole teacher), the cache
// claimed, then this rank's shards with progress and ETA, and the index once every shard is in.
#include "job/generate.hpp"

#include <spdlog/spdlog.h>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <fstream>

#include "comm/mpi_runtime.hpp"
#include "comm/signals.hpp"
#include "comm/startup.hpp"
#include "data/noiser.hpp"
#include "data/sample_schedule.hpp"
#include "job/cache_identity.hpp"
#include "job/plan_input.hpp"
#include "job/startup.hpp"
#include "objective/objective_spec.hpp"

namespace wd::job {

namespace {

using Clock = std::chrono::steady_clock;

/// Train's keys as generate's start-up runs them: every rank a colocated teacher (the whole
/// teacher where a student would compute) that reads no cache and resumes no checkpoint, with no
/// held-out set, which is the reading train's, not this job's (cache_layout checks it against the
/// train's students; run_generate_job puts it back).
void generate_keys(RunConfig& cfg) {
  cfg.train.eval_samples = 0;
  cfg.train.sample_every = 0;
  cfg.data.teacher_cache.clear();
  cfg.teacher.placement = TeacherPlacement::kColocated;
  cfg.teacher.layout = TeacherLayout::kGiven;
  cfg.teacher.ranks = 1;
  cfg.teacher.stages = 0;
  cfg.teacher.shard_map.clear();
  cfg.checkpoint.resume.clear();
  // How a group splits its tokens decides nothing the teacher makes: a group reads one stream,
  // so a train of G groups reads a cache of --students G (cache_streams).
  cfg.student.sequence_parallel = 1;
}

/// The cache's layout, once the data set's size is known: a training sample must remain. A cache
/// of trajectories (--keep) holds the rounds of the trained intervals of these keys (student.expert
/// may cut them).
teacher::CacheLayout checked_layout(const GenerateJob& g, std::int64_t keep) {
  const auto& cfg = g.train.cfg;
  WD_CHECK_AS(ConfigError, g.train.train_samples >= 1,
              "train.eval_samples(" << cfg.train.eval_samples << ") leaves no training sample in data.path("
                                    << cfg.data.path << ")");
  const auto per_round = keep > 0 ? objective::batches_per_round(cfg.keys(), g.train.student_range()) : 1;
  return cache_layout(cfg, g.students, g.shard_positions, keep, per_round);
}

/// This rank's whole teacher, where a colocated student of this job would compute.
teacher::TeacherStage load_generating_teacher(const TrainJob& job, RankMemory& memory) {
  teacher::StageLoad how;
  how.placement = job.placement;
  how.dtype = teacher_dtype(job.cfg);
  how.device = rank_device(job.cfg, job.placement, Role::kStudent, job.topo.local_rank);
  how.blocks = {0, job.teacher().config().num_layers};
  how.timeout_s = job.cfg.comm.timeout_s;
  return load_teacher_stage(job, how, memory);
}

/// Writes the shards of `layout` that fall to this rank (shard i: rank i mod world) and are not
/// complete yet, logging each with the rank's progress and its ETA. Returns false when SIGUSR1
/// (SLURM's warning before the time limit) stopped it between two shards, with shards left.
bool write_my_shards(GenerateJob& g, const teacher::CacheLayout& layout, int rank, int world) {
  auto& job = g.train;
  const auto& cfg = job.cfg;
  RankMemory memory;
  auto stage = load_generating_teacher(job, memory);
  data::DatasetReader reader(*job.info);
  const data::SampleSchedule schedule(job.train_samples, layout.batch, layout.students, cfg.train.seed);
  const data::FlowMatchingNoiser noiser(cfg.noise, cfg.train.seed, job.student_range());
  const data::FlowMatchingNoiser eval_noiser(cfg.noise, cfg.train.seed ^ 0xE7A1ULL, job.student_range());
  const auto mine = teacher::shards_of_rank(layout, rank, world);
  std::int64_t total = 0, done = 0, written = 0;
  for (const auto& id : mine) total += id.count;
  const auto t0 = Clock::now();
  for (std::size_t n = 0; n < mine.size(); ++n) {
    // SIGTERM/SIGINT stop the job between shards (a SIGKILL inside one leaves it to be redone).
    if (const int signal = comm::stop_signal()) throw comm::Interrupted(signal);
    const auto& id = mine[n];
    if (comm::requeue_signalled()) {
      spdlog::info("generate: SIGUSR1: stopped before shard {}/{} of this rank, {}/{} {} written; what is complete "
                   "stays, and a rerun with the same keys and --output completes the cache",
                   n + 1, mine.size(), done, total, layout.keep > 0 ? "trajectory rounds" : "messages");
      return false;
    }
    done += id.count;
    if (teacher::shard_complete(g.output, id, true)) {
      spdlog::info("generate: {} is complete already (a previous run's), kept", id.file_name());
      continue;
    }
    const teacher::SourceParts parts{
        {reader, schedule, noiser, eval_noiser, id.student, layout.students, layout.batch, job.train_samples},
        &stage, job.plan, job.model.patch_size, job.student_range()};
    const auto t = Clock::now();
    const auto hash = layout.keep > 0
                          ? teacher::write_trajectory_shard(g.output, id, *objective::trajectory_rounds(cfg.keys(), parts),
                                                            layout.keep)
                          : teacher::write_shard(g.output, id, *cfg.objective().source(cfg.keys(), parts), layout.batch);
    written += id.count;
    const auto seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const char* rows = layout.keep > 0 ? "trajectory rounds" : "messages";
    spdlog::info("generate: shard {}/{} of this rank, {} ({} {}, xxh64 {}) in {:.1f} s; {}/{} {}, ETA {:.0f} s",
                 n + 1, mine.size(), id.file_name(), id.count, rows, hash,
                 std::chrono::duration<double>(Clock::now() - t).count(), done, total, rows,
                 seconds / static_cast<double>(written) * static_cast<double>(total - done));
  }
  return true;
}

/// Before generating: every rank agrees (all go on, or all stop with one error).
template <typename F>
void agreed(const std::string& stage, const RunConfig& cfg, F&& stage_fn) {
  std::exception_ptr failure;
  try {
    stage_fn();
  } catch (...) {
    failure = std::current_exception();
  }
  comm::agree_on_startup(stage, failure, MPI_COMM_WORLD, cfg.comm.timeout_s, nullptr);
}

/// A failure before generating, agreed by every rank: rank 0 explains, all exit alike.
int startup_failure(int rank) {
  if (rank != 0) return exit_code_of(std::current_exception());
  const int code = report_failure("generate", std::current_exception());
  if (const char* status = std::getenv("WD_LAUNCH_STATUS"); status != nullptr && *status != '\0') {
    std::ofstream(status) << code << "\n";
  }
  return code;
}

}  // namespace

std::int64_t keep_intervals(const RunConfig& cfg, const std::string& keep) {
  if (keep.empty()) return 0;
  const auto& objective = cfg.objective();
  WD_CHECK_AS(ConfigError, objective.trajectory_stream(cfg.keys()),
              "generate --keep(" << keep << ") stores whole teacher trajectories; train.objective " << objective.name()
                                 << " samples none (leave --keep out: the cache holds its batches)");
  const auto N = cfg.teacher.steps, k = cfg.student.steps;
  std::int64_t K = 0;  // stays 0 unless the whole of `keep` is a number
  if (keep == "all") {
    K = N;
  } else if (const auto* end = keep.data() + keep.size(); std::from_chars(keep.data(), end, K).ptr != end) {
    K = 0;
  }
  WD_CHECK_AS(ConfigError, K >= 1 && N % K == 0 && k >= 1 && K % k == 0,
              "generate --keep(" << keep << ") must be all or a number of intervals K that divides teacher.steps(" << N
                                 << ") and that student.steps(" << k << ") divides (K + 1 states a trajectory)");
  return K;
}

teacher::CacheLayout cache_layout(const RunConfig& cfg, int students, std::int64_t shard_positions, std::int64_t keep,
                                  std::int64_t per_round) {
  ConfigProblems p;
  p.check(students >= 1, "generate --students(" + std::to_string(students) + ") must be >= 1");
  p.check(shard_positions >= 1, "generate --shard-positions(" + std::to_string(shard_positions) + ") must be >= 1");
  const auto global = cfg.train.batch_size * std::max(1, students);
  p.check(cfg.train.eval_samples % global == 0,
          "train.eval_samples(" + std::to_string(cfg.train.eval_samples) + ") must be a multiple of train.batch_size(" +
              std::to_string(cfg.train.batch_size) + ") x --students(" + std::to_string(students) + ")");
  p.check(per_round >= 1, "cache layout: " + std::to_string(per_round) + " batches a trajectory round");
  p.throw_if_any("cache layout");
  const auto eval = cfg.train.eval_samples / global, positions = cfg.train.steps * cfg.train.grad_accum;
  if (keep == 0) return {students, cfg.train.batch_size, eval, positions, shard_positions};
  return {students, cfg.train.batch_size, eval, (positions + per_round - 1) / per_round, shard_positions, 0, keep};
}

int run_generate_job(GenerateJob& g) {
  // What no cache can stand for is refused before MPI starts (every rank alike: the same keys).
  ConfigProblems cacheable;
  objective::check_cacheable(g.train.cfg.keys(), cacheable);
  cacheable.check(!g.train.cfg.writes_cache(),
                  "data.teacher_cache_write(" + g.train.cfg.data.teacher_cache_write +
                      ") is train's: generate writes its cache to --output");
  cacheable.throw_if_any("train keys");
  const auto keep = keep_intervals(g.train.cfg, g.keep);
  comm::MpiRuntime mpi(nullptr, nullptr);
  const int rank = mpi.rank();
  comm::install_signal_handlers();
  auto& job = g.train;
  teacher::CacheLayout layout;
  teacher::CacheIdentity identity;
  try {
    // The identity is the train's keys as given (before generate's own placement of the teacher).
    const auto train_cfg = job.cfg;
    generate_keys(job.cfg);
    start_train(job, mpi);
    job.cfg.train.eval_samples = train_cfg.train.eval_samples;
    job.train_samples -= train_cfg.train.eval_samples;
    layout = checked_layout(g, keep);
    job.plan.eval_messages = layout.eval_messages;
    agreed("claiming the cache folder", job.cfg, [&] {
      identity = cache_identity(train_cfg, *job.experts, *job.info, keep);
      if (rank == 0) teacher::claim_cache_dir(g.output, identity, layout);
    });
    if (rank == 0) {
      spdlog::info("generate: {} stream(s) of {} held-out and {} training {} of {} sample(s), {} shard(s) over "
                   "{} rank(s), into {}{}",
                   layout.students, layout.eval_messages, layout.positions,
                   keep > 0 ? "trajectory rounds" : "messages", layout.batch, teacher::cache_shards(layout).size(),
                   mpi.size(), g.output,
                   keep > 0 ? fmt::format(" (--keep {}: each trajectory's {} states, one every {} of its {} teacher "
                                          "steps, for students of any student.steps dividing {})",
                                          keep, keep + 1, job.cfg.teacher.steps / keep, job.cfg.teacher.steps, keep)
                            : std::string());
    }
  } catch (...) {
    return startup_failure(rank);
  }
  try {
    if (!write_my_shards(g, layout, rank, mpi.size())) {
      // Each rank stops on its own (no collective: another may be inside a shard, or done);
      // the launcher ends the rest, whose unfinished shard is redone by the rerun.
      spdlog::info("exiting with code {} (requeue: rerun generate to complete the cache)", kExitRequeue);
      mpi.exit_without_finalize(kExitRequeue);
    }
    // The rank that finds every shard's entry in writes the index (two that do write the same one).
    if (teacher::write_index_if_complete(g.output, identity, layout)) {
      spdlog::info("generate: the cache {} is complete (index.json written)", g.output);
    }
    return kExitOk;
  } catch (...) {
    // The ranks generate apart: this one stops the job (mpirun ends the others); what was complete
    // stays, and a rerun redoes the rest.
    const int code = report_failure("generate", std::current_exception());
    mpi.exit_without_finalize(code);
  }
}

}  // namespace wd::job
