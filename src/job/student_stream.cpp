// A student rank's stream of batches: its teacher rank's link, or the messages it makes itself
// with the objective's source (a colocated teacher, or flow's targets), and a colocated
// teacher's real score (dmd).
#include "comm/transport_factory.hpp"
#include "job/cache_identity.hpp"
#include "job/plan_input.hpp"
#include "job/student_side.hpp"
#include "objective/objective_spec.hpp"
#include "teacher/target_source.hpp"
#include "teacher/cache_recorder.hpp"
#include "teacher/teacher_cache.hpp"

namespace wd::job {

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

namespace {

/// teacher.placement colocated, dmd: this rank's own teacher answers its requests on the spot.
class LocalScore final : public student::RealScore {
 public:
  explicit LocalScore(teacher::TeacherStage& stage) : stage_(stage) {}
  void ask(std::int64_t cycle, const comm::TensorDict& request) override {
    auto b = teacher::StageBatch::inputs_of(request);  // with an i2v teacher's y
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

}  // namespace

/// A rank that makes its own batches (teacher.placement colocated, or an objective without a
/// teacher) or reads them (data.teacher_cache): its own teacher when the objective has one and
/// this rank computes with it, the batches (no cache) or the real score (dmd, colocated) (all
/// blocks on the student's device, teacher.compute and micro_batch as on a teacher rank), its
/// share of the data, and the source: the objective's, which makes the messages a teacher rank
/// would have sent it, or the cache's stream of this student, which holds them.
struct OwnStream {
  std::optional<teacher::TeacherStage> stage;
  LocalData data;
  /// A cache of whole trajectories (generate --keep): this student's stream of them, and the
  /// sample schedule of the generate that wrote it (one replica per stream).
  std::unique_ptr<teacher::CachedTrajectories> stored;
  std::optional<data::SampleSchedule> stored_schedule;
  std::unique_ptr<teacher::TargetSource> source;
  teacher::LocalReceiver transport;

  OwnStream(const TrainJob& job, const c10::Device& device, RankMemory& memory)
      : stage(own_teacher(job)
                  ? std::optional<teacher::TeacherStage>(load_teacher_stage(job, load_for(job, device), memory))
                  : std::nullopt),
        data(job),
        source(make_source(job, stage ? &*stage : nullptr, data, stored, stored_schedule)),
        transport(job.cfg.from_cache() ? "teacher cache" : stage ? "colocated teacher" : "local targets", *source,
                  job.plan, device, stage.has_value() && !job.cfg.from_cache()) {}

  /// Whether this rank holds a teacher: colocated (no teacher rank) with a teacher that makes its
  /// batches (no cache) or answers its real score.
  static bool own_teacher(const TrainJob& job) {
    const auto& cfg = job.cfg;
    return job.experts && job.layout.colocated() && (!cfg.from_cache() || cfg.objective().traits().real_score);
  }

  static std::unique_ptr<teacher::TargetSource> make_source(const TrainJob& job, teacher::TeacherStage* stage,
                                                            LocalData& data,
                                                            std::unique_ptr<teacher::CachedTrajectories>& stored,
                                                            std::optional<data::SampleSchedule>& stored_schedule) {
    const int replica = job.layout.replica_of(job.world_rank());
    const auto& dir = job.cfg.data.teacher_cache;
    if (!dir.empty()) {  // the cache's stream s: student s's, or its sequence-parallel group's
      const int s = cache_stream_of(job, job.world_rank());
      const bool cycle = job.cfg.data.teacher_cache_end == data::CacheEnd::kCycle;
      auto index = teacher::read_cache_index(dir);
      if (index.layout.keep == 0) return std::make_unique<teacher::CacheSource>(dir, std::move(index), s, cycle);
      // Whole trajectories: this student deals them into its batches as generate's replica s would.
      const auto& l = index.layout;
      stored_schedule.emplace(job.train_samples, l.batch, l.students, job.cfg.train.seed);
      const int students = l.students;
      const auto batch = l.batch;
      stored = std::make_unique<teacher::CachedTrajectories>(dir, std::move(index), s, cycle);
      return objective::trajectory_rounds(
          job.cfg.keys(), {{data.reader, *stored_schedule, data.noiser, data.eval_noiser, s, students, batch,
                            job.train_samples},
                           nullptr, job.plan, job.model.patch_size, job.student_range(), stored.get()});
    }
    auto source = job.cfg.objective().source(
        job.cfg.keys(), {{data.reader, data.schedule, data.noiser, data.eval_noiser, replica, job.layout.replicas,
                          job.per_replica, job.train_samples},
                         stage, job.plan, job.model.patch_size, job.student_range()});
    if (!job.cfg.writes_cache() || !stage) return source;
    // A colocated teacher's batches, written as this student's stream of the cache.
    return std::make_unique<teacher::CacheRecorder>(std::move(source), job.cfg.data.teacher_cache_write,
                                                    job.layout.student_index(job.world_rank()), 1,
                                                    job.plan.batch_per_student);
  }

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

StudentStream::StudentStream() = default;
StudentStream::StudentStream(StudentStream&&) noexcept = default;
StudentStream::~StudentStream() = default;

teacher::TeacherStage* StudentStream::own_stage() const { return own && own->stage ? &*own->stage : nullptr; }

StudentStream open_stream(const TrainJob& job, const c10::Device& device, RoleServices& services) {
  const auto& cfg = job.cfg;
  const auto& plan = job.plan;
  StudentStream s;
  if (job.layout.colocated() || cfg.from_cache()) {  // teacher.placement colocated, no teacher, or a cache
    s.own = std::make_unique<OwnStream>(job, device, services.memory);
    s.transport = &s.own->transport;
  } else {
    s.link = comm::make_receiver(comm::link_end(*job.groups, job.world_rank(), cfg.comm), plan.message_spec(),
                                 cfg.comm, 0, plan.end_step(), device, &services.health);
    services.memory.transport_bytes = plan.message_spec().bytes() * static_cast<std::uint64_t>(cfg.comm.prefetch_depth);
    s.transport = s.link.get();
  }
  return s;
}

std::unique_ptr<student::RealScore> local_score(teacher::TeacherStage& stage) {
  return std::make_unique<LocalScore>(stage);
}

}  // namespace wd::job
