// The objective wing: one ObjectiveSpec per train.objective (its traits, its config checks, its
// costs for `plan` and the calibration, the loop's [train]), in one table that the rest of the
// job asks instead of comparing the objective's name (docs/architecture.md#objectives).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "student/dmd_config.hpp"
#include "student/student_config.hpp"
#include "teacher/teacher_config.hpp"

namespace wd {
struct WanConfig;
}  // namespace wd

namespace wd::comm {
struct StreamPlan;
}  // namespace wd::comm

namespace wd::data {
struct TimestepRange;
struct DatasetInfo;
struct NoiseConfig;
}  // namespace wd::data

namespace wd::plan {
struct PlanInput;
}  // namespace wd::plan

namespace wd::teacher {
struct TrajectorySpec;
struct SourceParts;
class TargetSource;
class TeacherStage;
class TrajectoryRounds;
}  // namespace wd::teacher

namespace wd::objective {

/// The sections of a run's config that objectives read (views; the caller owns them).
struct Keys {
  const teacher::TeacherConfig& teacher;
  const student::StudentConfig& student;
  const student::TrainConfig& train;
  const student::DmdConfig& dmd;
  /// data.teacher_cache is set: the teacher's batches come from a cache (a live teacher, where
  /// the objective asks one, answers its real score alone).
  bool teacher_cache = false;
};

/// When an objective's teacher forwards are guided ([cond; neg] in one batch, v_neg + g·(v_cond − v_neg)).
enum class Guidance {
  kNever,     ///< the plain velocity
  kAlways,    ///< the guided velocity is the target
  kUnlessOne  ///< guided unless teacher.guidance is 1 (the teacher samples, or answers, guided)
};

/// What the job asks of an objective that does not depend on the keys.
struct Traits {
  bool needs_teacher = true;  ///< false: trains on the data alone (teacher.ranks 0)
  /// Why every teacher block must be in one forward (text after "train.objective NAME"); empty:
  /// the teacher may be split into pipeline stages.
  std::string whole_teacher;
  Guidance guidance = Guidance::kNever;
  /// Why a LoRA student has nothing to learn (text after "train.objective NAME"); empty: allowed.
  std::string no_lora_student;
  /// Sampled in student.steps Euler jumps on teacher.shift's schedule (its probe samples so).
  bool few_step = false;
  /// The teacher's batches are its own trajectories, whatever the keys.
  bool trajectories = false;
  /// Students ask the teacher for scores at their own samples (a request channel back to the
  /// teacher, a critic, cycles of train.critic_ratio steps).
  bool real_score = false;
  /// The student samples the teacher's latents from noise: a teacher whose noisy-latent channels are
  /// out_dim (t2v, ti2v, and i2v, whose y rides beside them).
  bool samples_teacher_latents = false;
};

/// One train.objective. The base answers from the traits; a spec overrides what its keys change.
class ObjectiveSpec {
 public:
  ObjectiveSpec(std::string name, std::string summary, Traits traits)
      : name_(std::move(name)), summary_(std::move(summary)), traits_(std::move(traits)) {}
  virtual ~ObjectiveSpec() = default;
  ObjectiveSpec(const ObjectiveSpec&) = delete;
  ObjectiveSpec& operator=(const ObjectiveSpec&) = delete;

  /// The train.objective value.
  const std::string& name() const { return name_; }
  /// What it trains, for --help.
  const std::string& summary() const { return summary_; }
  const Traits& traits() const { return traits_; }

  /// Its config problems when it is train.objective: its own keys, and the shared keys it limits.
  virtual void check(const Keys& k, ConfigProblems& p) const {}
  /// Its own keys' problems when `active` trains instead: they must keep their defaults.
  virtual void check_unused(const Keys& k, const std::string& active, ConfigProblems& p) const {}
  /// Its problems once the teacher's architecture and the layout's pipeline stages are known:
  /// what its traits ask of them (whole_teacher, samples_teacher_latents, no_lora_student).
  void check_teacher(const Keys& k, const WanConfig& teacher, int stages, ConfigProblems& p) const;
  /// Reads the files its teacher forwards need beyond the checkpoint (a guided teacher's
  /// teacher.negative, `text_dim` wide), so that a bad one stops the job before anything is loaded.
  void check_teacher_files(const Keys& k, std::int64_t text_dim) const;
  /// Its problems with student.expert set (one expert's side of t).
  void check_expert(const Keys& k, ConfigProblems& p) const;
  /// Stops the job when nothing of student.expert's `range` is trained: none of the student's
  /// intervals starts there (trajectory streams), or the noise's σ distribution never reaches it.
  void check_range(const Keys& k, const data::NoiseConfig& noise, const data::TimestepRange& range) const;
  /// Stops the job when the data set lacks what it trains from (the latents, unless trajectory_stream()).
  void check_data(const Keys& k, const data::DatasetInfo& info) const;
  /// Whether the teacher's batches are its trajectories (teacher.steps forwards serve the
  /// student's student.steps intervals, and the data set may hold contexts alone).
  virtual bool trajectory_stream(const Keys& k) const { return traits_.trajectories; }
  /// Whether the training batches carry teacher targets (false: the data alone).
  virtual bool train_targets(const Keys& k) const { return true; }
  /// Whether the batches carry start states (x_start: a roll-out's noise).
  virtual bool start_states(const Keys& k) const { return false; }
  /// Why a teacher cache cannot hold its batches with these keys (text after "a teacher cache
  /// (...) with train.objective NAME"); empty: it can. By default: none without a teacher.
  virtual std::string uncached(const Keys& k) const;
  /// Real-score requests (in samples) per trained sample.
  virtual double requests(const Keys& k) const { return 0.0; }
  /// Student forwards per trained sample beyond a training step's forward and backward (3);
  /// `critic_cost` is a critic forward in student forwards (dmd).
  virtual double student_extra_forwards(const Keys& k, double critic_cost) const { return 0.0; }

  /// The source of one replica's batches, made on the rank that makes them (a teacher rank's
  /// first stage, or a student computing its own): by default the teacher's trajectories when
  /// trajectory_stream(), else the data and the stage's forward (teacher/target_source.hpp).
  virtual std::unique_ptr<teacher::TargetSource> source(const Keys& k, const teacher::SourceParts& parts) const;

  /// Logs what the teacher does for it at start-up (rank 0 of a teacher or colocated job): the
  /// trajectories it samples (trajectory streams); `range` is the student's timesteps
  /// (student.expert), `colocated` whether each student has its own teacher.
  virtual void log_teacher(const Keys& k, const data::TimestepRange& range, bool colocated) const;
  /// Sets what a teacher stage's forwards need for it: the guidance (teacher.guidance, the
  /// negative context of teacher.negative, `text_dim` wide, or zeros) when guided(); when `log`,
  /// logs that and log_teacher's lines.
  void prepare_stage(const Keys& k, teacher::TeacherStage& stage, std::int64_t text_dim,
                     const data::TimestepRange& range, bool colocated, bool log) const;
  /// Whether the teacher's forwards reach every t whatever student.expert (its trajectories from
  /// noise, or the generator's samples): when false a student.expert job loads that expert alone.
  bool reaches_every_expert(const Keys& k) const {
    return trajectory_stream(k) || traits_.samples_teacher_latents;
  }
  /// What its batches carry beyond the data's shapes (start states, teacher targets, the
  /// real-score channel), set into the stream's plan.
  void shape_stream(const Keys& k, comm::StreamPlan& plan) const;
  /// What it asks of the planner: the teacher's forwards per batch ([cond; neg] when guided) and
  /// whether the teacher must stay whole on one rank.
  void shape_plan(const Keys& k, plan::PlanInput& in) const;

  /// Whether the teacher's forwards are guided, by Traits::guidance and teacher.guidance.
  bool guided(const Keys& k) const;
  /// Teacher forwards (in samples) per trained sample: 1 per target (teacher.steps / student.steps
  /// for trajectories, 0 without targets) plus the requests, doubled when guided.
  double teacher_forwards(const Keys& k) const;
  /// Whether the data set must hold latents (not for a trajectory stream, which starts from noise).
  bool needs_latents(const Keys& k) const { return !trajectory_stream(k); }
  /// The [train] section as the student loop uses it: a few-step student's probe samples its own
  /// student.steps Euler jumps on teacher.shift's schedule; trajectory students' evaluations
  /// report each interval.
  student::TrainConfig loop_train(const Keys& k) const;

 private:
  std::string name_;
  std::string summary_;
  Traits traits_;
};

/// The schedules of the teacher's trajectories (teacher.steps, solver and shift; student.steps).
teacher::TrajectorySpec trajectory_spec(const Keys& k);
/// The same, with the intervals cut to those starting in `range` (student.expert's side; every
/// interval when the range is all of t).
teacher::TrajectorySpec trajectory_spec(const Keys& k, const data::TimestepRange& range);
/// The batches one trajectory round deals (a round of a --keep cache): the trained intervals of
/// trajectory_spec(k, range), student.steps or, cut to `range`, those on student.expert's side.
std::int64_t batches_per_round(const Keys& k, const data::TimestepRange& range);

/// The trajectory rounds of a trajectory stream (trajectory_stream()): parts' stage samples
/// them, or parts.stored holds them (a teacher cache of trajectories); what source() makes for it.
std::unique_ptr<teacher::TrajectoryRounds> trajectory_rounds(const Keys& k, const teacher::SourceParts& parts);

/// The spec named `name`; a ConfigError naming train.objective and every name of the table
/// otherwise.
const ObjectiveSpec& find(const std::string& name);
/// The names of the table, in its order (the five built in first).
std::vector<std::string> names();
/// Adds `spec` to the table (an objective of a test binary, before any option is parsed); a name
/// already there is a ConfigError.
void add(std::unique_ptr<ObjectiveSpec> spec);

/// Binds train.objective to `field`: --help lists the table's names and summaries, and a name
/// not in the table is a ConfigError when the options are parsed.
void bind(OptionTable& t, std::string& field);
/// Every objective's checks: the active one's check(), the others' check_unused(), and what
/// each trait asks of the teacher keys (teacher.ranks against needs_teacher; with
/// Keys::teacher_cache, check_cacheable and the teacher ranks: none, or for a real score a live
/// teacher, teacher.ranks >= 1 or teacher.placement colocated).
void check(const Keys& k, ConfigProblems& p);
/// Whether a teacher cache can hold the batches of `k` (generate, data.teacher_cache): not where
/// the spec's uncached() says why (no teacher: flow; no teacher target in the training batches:
/// dmd without its regression term), nor with student.features (not stored yet).
void check_cacheable(const Keys& k, ConfigProblems& p);

}  // namespace wd::objective
