// start_train: the start-up stages of `train` in order, every rank agreeing on each outcome
// (the stages themselves: startup.cpp).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "comm/signals.hpp"
#include "comm/startup.hpp"
#include "core/logging.hpp"
#include "core/threads.hpp"
#include "job/cache_identity.hpp"
#include "job/layout_report.hpp"
#include "job/plan_input.hpp"
#include "job/rank_placement.hpp"
#include "job/startup.hpp"

namespace wd::job {

namespace {

/// Runs `stage_fn` and makes every rank agree on its outcome (all throw, or none).
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

// Each decision as the integers world rank 0 broadcasts, and back.
std::vector<std::int64_t> to_ints(const LayoutChoice& c) {
  return {c.colocated ? 1 : 0, c.teacher_ranks, c.stages, c.micro_batch};
}
void from_ints(const std::vector<std::int64_t>& v, LayoutChoice& c) {
  c = {v[0] != 0, static_cast<int>(v[1]), static_cast<int>(v[2]), v[3]};
}
std::vector<std::int64_t> to_ints(const PlacementChoice& c) {
  return {static_cast<std::int64_t>(c.placement), c.compute ? static_cast<std::int64_t>(*c.compute) : -1};
}
void from_ints(const std::vector<std::int64_t>& v, PlacementChoice& c) {
  c.placement = static_cast<plan::Placement>(v[0]);
  c.compute = v[1] >= 0 ? std::optional<c10::ScalarType>(static_cast<c10::ScalarType>(v[1])) : std::nullopt;
}
std::vector<std::int64_t> to_ints(const DataShape& s) {
  return {s.latent[0], s.latent[1], s.latent[2], s.latent[3], s.context_len, s.samples};
}
void from_ints(const std::vector<std::int64_t>& v, DataShape& s) {
  s = {{v[0], v[1], v[2], v[3]}, v[4], v[5]};
}
std::vector<std::int64_t> to_ints(std::int64_t n) { return {n}; }
void from_ints(const std::vector<std::int64_t>& v, std::int64_t& n) { n = v[0]; }

/// World rank `root`'s `value`, on every rank.
template <typename T>
T from_root(int root, T value, const std::string& what, const RunConfig& cfg) {
  auto ints = to_ints(value);
  comm::broadcast_ints(ints, root, MPI_COMM_WORLD, cfg.comm.timeout_s, what.c_str(), nullptr);
  from_ints(ints, value);
  return value;
}

/// `decide` runs on world rank `root` only; every rank agrees on its outcome and gets its answer.
template <typename T, typename F>
T decided_by(int root, const std::string& stage, const RunConfig& cfg, F&& decide) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  T value{};
  agreed(stage, cfg, [&] {
    if (rank == root) value = decide();
  });
  return from_root(root, value, stage, cfg);
}


/// Who reads a teacher cache's streams, after "N student rank(s)": "" (each its own), or the
/// sequence-parallel groups that each read one.
std::string cache_readers(const RunConfig& cfg, const comm::Layout& layout) {
  const auto n = cfg.student.sequence_parallel;
  if (n <= 1) return "";
  return fmt::format(" in {} sequence-parallel group(s) of {}", cache_streams(cfg, layout), n);
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

/// The roles every rank takes: `layout`'s, with logging for this rank's role and, when `final`,
/// its threads.
void take_roles(TrainJob& job, const comm::Layout& layout, const comm::MpiRuntime& mpi, bool final) {
  job.topo = layout.topology(mpi.rank(), mpi.local_rank(), mpi.local_size());
  init_logging(job.topo, job.cfg.log.level);
  if (final) set_threads(job.cfg, job.topo);
}

/// The roles before the placement is known. Where each replica can have a node to itself they
/// depend on the replica's size, so a single replica (always a valid split) serves until then;
/// on several nodes the final layout may move a role.
comm::Layout provisional_layout(const RunConfig& cfg, int world, const std::vector<int>& nodes) {
  return layout_with_stages(cfg, world, std::max(1, cfg.teacher.ranks), nodes);
}

/// The roles of the decided layout; world rank 0 logs the rank table (layout_report.hpp: what
/// `wan-distill layout` prints for this config and allocation).
void settle_roles(TrainJob& job, const comm::MpiRuntime& mpi, const std::vector<int>& nodes) {
  const auto& cfg = job.cfg;
  job.layout = make_layout(cfg, job.placement, mpi.size(), nodes);
  if (job.layout.role_of(mpi.rank()) != job.topo.role) take_roles(job, job.layout, mpi, true);
  // The device this rank will compute on: it was checked usable by the checks' stage below on
  // a student (student.device), and by the placement's stage on the teacher's world rank 0.
  int gpu = -1;
  try {
    const auto device = rank_device(cfg, job.placement, job.topo.role, job.topo.local_rank);
    gpu = device.is_cuda() ? device.index() : -1;
  } catch (const ConfigError&) {
    // Reported, agreed, by the checks below.
  }
  const auto places = log_rank_placement(job.topo, gpu, cfg.comm.timeout_s);
  const auto& layout = job.layout;
  if (mpi.rank() == 0 && cfg.from_cache() && !cfg.cache_only()) {
    spdlog::info("train: data.teacher_cache {}: {} student rank(s){}, each reading its stream of the teacher's batches "
                 "from the cache; the real score answered by {}, run dir {}",
                 cfg.data.teacher_cache, layout.student_ranks, cache_readers(cfg, layout),
                 layout.colocated() ? "each student's colocated teacher"
                                    : std::to_string(layout.teacher_ranks) + " teacher rank(s), which send no batches",
                 cfg.run_dir);
  } else if (mpi.rank() == 0 && cfg.from_cache()) {
    spdlog::info("train: data.teacher_cache {}: {} student rank(s){}, each reading its stream of the teacher's batches "
                 "from the cache, no teacher ranks, run dir {}",
                 cfg.data.teacher_cache, layout.student_ranks, cache_readers(cfg, layout), cfg.run_dir);
  } else if (mpi.rank() == 0 && !cfg.has_teacher()) {
    spdlog::info("train: train.objective {}: {} student rank(s), each computing its own targets from its share of "
                 "the data, no teacher, run dir {}",
                 cfg.train.objective, layout.student_ranks, cfg.run_dir);
  } else if (mpi.rank() == 0 && layout.colocated()) {
    spdlog::info("train: teacher.placement colocated: {} student rank(s), each computing its own targets with "
                 "the teacher on its {} (mapped once per node), no teacher ranks, run dir {}",
                 layout.student_ranks, job.placement == plan::Placement::kGpu ? "GPU" : "host", cfg.run_dir);
  } else if (mpi.rank() == 0) {
    spdlog::info("train: {} teacher rank(s) ({} replica(s) x {} stage(s), placement {}), {} student rank(s), {}, "
                 "run dir {}",
                 layout.teacher_ranks, layout.replicas, layout.stages, plan::placement_name(job.placement),
                 layout.student_ranks, layout.placement, cfg.run_dir);
  }
  if (mpi.rank() == 0) spdlog::info("train {}", describe_layout(layout, places, cfg.comm.backend));
  job.groups.emplace(job.layout, mpi.rank());
}

/// The teacher, student and data set checked on every rank (the teacher mapped, cheap), the
/// data by the ranks that read it; then world rank 0 (such a rank) tells everyone its shapes.
DataShape check_inputs(TrainJob& job, int rank) {
  const auto& cfg = job.cfg;
  agreed("checking the teacher, student and data set", cfg, [&] {
    if (cfg.has_teacher()) {
      job.experts = open_teacher(cfg);
      for (const auto& e : job.experts->experts()) e.check();
      if (rank == 0 && job.experts->two_experts()) {
        const auto& ex = *job.experts;
        spdlog::info("teacher {}: two experts, {} for t >= {} and {} below (boundary {}), {}", ex.path(),
                     ex.expert_name(WanExperts::kHigh), ex.boundary_timestep(), ex.expert_name(WanExperts::kLow),
                     ex.boundary(), ex.boundary_origin());
      }
      job.model = job.teacher().config();
    } else {  // every rank reads the data set: its shapes make the model
      job.model = model_for_data(data::validate_dataset(cfg.data_path(), {}), cfg.student.model_type);
    }
    check_job(cfg, job.model, job.layout);
    check_student_expert(cfg, job.experts ? &*job.experts : nullptr);
    check_sequence_parallel(cfg, job.experts ? &*job.experts : nullptr, job.layout);
    // A student.device this rank cannot use stops the job here, before anything is loaded.
    if (job.topo.role == Role::kStudent) static_cast<void>(rank_device(cfg, job.placement, Role::kStudent, job.topo.local_rank));
    // The cache's students read the data set too: its fingerprint is in the cache's identity.
    if (job.topo.role == Role::kTeacher || job.layout.colocated() || cfg.from_cache()) {
      job.info = check_data(cfg, job.model);
      check_sequence_tokens(cfg, job.model, job.info->latent_shape);
    }
  });
  DataShape shape;
  if (rank == 0) shape = {job.info->latent_shape, job.info->context_len, job.info->samples};
  return from_root(0, shape, "data shape", cfg);
}

/// teacher.micro_batch: a number of samples as given, or `auto` timed on world rank 0 (a
/// teacher, or a colocated student: where the teacher computes).
std::int64_t agreed_micro_batch(const TrainJob& job) {
  const auto& cfg = job.cfg;
  if (!job.experts || cfg.cache_only()) return 0;  // no teacher forward on this job
  if (const auto n = cfg.teacher.micro_batch_samples()) return *n;
  return decided_by<std::int64_t>(0, "choosing the teacher micro-batch (teacher.micro_batch auto)", cfg, [&] {
    const auto role = job.layout.colocated() ? Role::kStudent : Role::kTeacher;
    return choose_teacher_micro_batch(job, rank_device(cfg, job.placement, role, 0));
  });
}

/// The first student opens the checkpoint store (opening one clears what crashed saves left,
/// so it alone does) and finds the step; every rank takes it and names the folder alike.
void agree_on_resume_point(TrainJob& job) {
  const auto& cfg = job.cfg;
  const int leader = job.layout.student_world_ranks().front();
  const auto step = decided_by<std::int64_t>(leader, "finding the checkpoint to resume from", cfg, [&] {
    job.store.emplace(cfg.checkpoint_root(), static_cast<std::size_t>(cfg.checkpoint.keep));
    return find_resume_point(cfg, *job.store).step;
  });
  job.plan.first_step = step;
  job.resume_path = resume_path(cfg, step);
  if (step > 0 && job.world_rank() == 0) spdlog::info("resuming from {} (step {})", job.resume_path, step);
}

}  // namespace

void start_train(TrainJob& job, comm::MpiRuntime& mpi) {
  auto& cfg = job.cfg;
  const int rank = mpi.rank();
  // Identical on every rank (same arguments): no communication needed to agree.
  cfg.validate();
  const auto nodes = gather_node_of_ranks(rank, mpi.size(), cfg.comm.timeout_s);
  take_roles(job, provisional_layout(cfg, mpi.size(), nodes), mpi, cfg.teacher.layout != TeacherLayout::kAuto);
  agreed("preparing the run directory", cfg, [&] {
    if (rank == 0) prepare_run_dir(cfg);
  });
  if (cfg.teacher.layout == TeacherLayout::kAuto) {  // timed and decided on world rank 0
    const auto choice = decided_by<LayoutChoice>(0, "choosing the layout (teacher.layout auto)", cfg,
                                                 [&] { return choose_layout(cfg, mpi.size()); });
    apply_layout(choice, cfg.teacher);
    take_roles(job, provisional_layout(cfg, mpi.size(), nodes), mpi, true);
  }
  // Decided once, on world rank 0, so that every rank computes alike.
  const auto placement = decided_by<PlacementChoice>(0, "choosing the teacher placement", cfg,
                                                     [&] { return choose_placement(cfg, mpi.size()); });
  job.placement = placement.placement;
  job.compute = placement.compute;
  settle_roles(job, mpi, nodes);
  job.broadcast = cfg.comm.mode == CommMode::kBroadcast;
  job.per_replica = per_replica_batch(cfg, job.layout);
  const auto shape = check_inputs(job, rank);
  job.plan = stream_plan_for(cfg, job.model, shape.latent, shape.context_len);
  job.plan.eval_messages = cfg.train.eval_samples / global_batch(cfg, job.layout);
  job.plan.train_steps = cfg.train.steps;
  job.train_samples = shape.samples - cfg.train.eval_samples;
  if (cfg.from_cache()) agreed("checking the teacher cache (data.teacher_cache)", cfg, [&] { check_teacher_cache(job); });
  if (cfg.writes_cache()) {
    agreed("claiming the teacher cache (data.teacher_cache_write)", cfg, [&] { claim_written_cache(job); });
  }
  job.micro_batch = agreed_micro_batch(job);
  agree_on_resume_point(job);
}

}  // namespace wd::job
