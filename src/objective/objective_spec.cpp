// The objective table and what every spec computes from its traits.
#include "objective/objective_spec.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "comm/stream_plan.hpp"
#include "core/errors.hpp"
#include "data/dataset_info.hpp"
#include "data/noiser.hpp"
#include "model/image_condition.hpp"
#include "model/negative_context.hpp"
#include "model/wan_config.hpp"
#include "objective/builtin.hpp"
#include "plan/planner.hpp"
#include "teacher/target_source.hpp"
#include "teacher/teacher_stage.hpp"
#include "teacher/trajectory.hpp"

namespace wd::objective {

namespace {

/// The table: the five built in, then what add() brings. Filled once, before options are parsed.
std::vector<std::unique_ptr<ObjectiveSpec>>& table() {
  static std::vector<std::unique_ptr<ObjectiveSpec>> specs = [] {
    std::vector<std::unique_ptr<ObjectiveSpec>> s;
    s.push_back(make_velocity());
    s.push_back(make_guided());
    s.push_back(make_flow());
    s.push_back(make_trajectory());
    s.push_back(make_dmd());
    return s;
  }();
  return specs;
}

}  // namespace

bool ObjectiveSpec::guided(const Keys& k) const {
  switch (traits_.guidance) {
    case Guidance::kAlways: return true;
    case Guidance::kUnlessOne: return !k.teacher.guidance.is_one();
    case Guidance::kNever: break;
  }
  return false;
}

double ObjectiveSpec::teacher_forwards(const Keys& k) const {
  const double guidance = guided(k) ? 2.0 : 1.0;
  const double per_target =
      !train_targets(k) ? 0.0
      : trajectory_stream(k)
          ? static_cast<double>(k.teacher.steps) / static_cast<double>(std::max<std::int64_t>(1, k.student.steps))
          : 1.0;
  return guidance * (per_target + requests(k));
}

student::TrainConfig ObjectiveSpec::loop_train(const Keys& k) const {
  auto t = k.train;
  if (traits_.few_step) {
    t.sample_steps = k.student.steps;
    t.sample_shift = k.teacher.shift;
    t.sample_solver = Solver::kEuler;
  }
  t.interval_metrics = trajectory_stream(k);
  return t;
}

std::unique_ptr<teacher::TargetSource> ObjectiveSpec::source(const Keys& k, const teacher::SourceParts& parts) const {
  WD_CHECK(trajectory_stream(k) || !parts.stored,
           "train.objective " << name_ << ": stored trajectories stand for a trajectory stream's teacher");
  if (trajectory_stream(k)) return trajectory_rounds(k, parts);
  WD_CHECK(parts.stage, "train.objective " << name_ << ": its batches need a teacher stage on this rank");
  return std::make_unique<teacher::StageTargets>(parts.samples, *parts.stage, parts.plan);
}

std::string ObjectiveSpec::uncached(const Keys&) const {
  return traits_.needs_teacher ? "" : ": it trains on the data alone, there is no teacher to cache";
}

void ObjectiveSpec::log_teacher(const Keys& k, const data::TimestepRange& range, bool) const {
  if (!trajectory_stream(k)) return;
  const auto spec = trajectory_spec(k, range);
  spdlog::info("train.objective {}: the teacher samples {} {} steps (shift {}) from seeded noise; the student learns "
               "the jumps between its {} σ, {} teacher forwards a trained sample",
               name_, spec.teacher_steps, name_of(spec.solver), spec.shift, spec.student_steps, teacher_forwards(k));
  if (!spec.intervals.empty()) {
    std::string list;
    for (const auto i : spec.intervals) list += (list.empty() ? "" : ", ") + std::to_string(i);
    spdlog::info("student.expert {}: the student learns intervals {} of {} (those starting at {}); the teacher "
                 "samples as far as the last one's end",
                 k.student.expert, list, spec.student_steps, range.describe());
  }
  if (k.train.trajectory_rollout > 0) {
    spdlog::info("train.trajectory_rollout {}: the first {} of each student's {} samples start from the state the "
                 "student's own jumps reach from the trajectory's noise (x_start sent with each batch)",
                 k.train.trajectory_rollout,
                 std::llround(k.train.trajectory_rollout * static_cast<double>(k.train.batch_size)),
                 k.train.batch_size);
  }
}

void ObjectiveSpec::check_teacher(const Keys& k, const WanConfig& teacher, int stages, ConfigProblems& p) const {
  p.check(traits_.whole_teacher.empty() || stages <= 1,
          "train.objective " + name_ + traits_.whole_teacher + "; teacher.placement shard splits it over " +
              std::to_string(stages) + " stages (use gpu, cpu, stream or colocated)");
  // i2v's y rides beside the latents (in_dim counts it); ti2v's clean first frame is one of them.
  p.check(!traits_.samples_teacher_latents || latent_channels_of(teacher) == teacher.out_dim,
          "train.objective " + name_ + "'s generator samples the teacher's latents from noise: it needs a "
          "teacher whose noisy-latent channels equal out_dim, not model_type " + teacher.model_type + " with in_dim " +
              std::to_string(teacher.in_dim) + " (latent channels " + std::to_string(latent_channels_of(teacher)) +
              "), out_dim " + std::to_string(teacher.out_dim));
  p.check(k.student.lora_rank == 0 || traits_.no_lora_student.empty(),
          "student.lora_rank(" + std::to_string(k.student.lora_rank) + ") with train.objective " + name_ + ": " +
              traits_.no_lora_student);
}

void ObjectiveSpec::check_teacher_files(const Keys& k, std::int64_t text_dim) const {
  if (guided(k) && !k.teacher.negative.empty()) static_cast<void>(load_negative_context(k.teacher.negative, text_dim));
}

void ObjectiveSpec::check_expert(const Keys& k, ConfigProblems& p) const {
  p.check(!traits_.samples_teacher_latents,
          "student.expert(" + k.student.expert + ") with train.objective " + name_ + ": the generator samples across "
          "both experts' t ranges; train both experts' adapters in one job (a LoRA student without student.expert, "
          "docs/lora.md#two-expert-teachers)");
}

void ObjectiveSpec::check_range(const Keys& k, const data::NoiseConfig& noise, const data::TimestepRange& range) const {
  if (trajectory_stream(k)) {
    static_cast<void>(trajectory_spec(k).intervals_in(range));
  } else {
    static_cast<void>(data::FlowMatchingNoiser(noise, k.train.seed, range));
  }
}

void ObjectiveSpec::check_data(const Keys& k, const data::DatasetInfo& info) const {
  WD_CHECK_DATA(info.has_latents || !needs_latents(k), info.path, "/latents",
                "is missing: the file holds contexts only (make-dataset --contexts-only, prepare_data.py captions); "
                "train.objective " << name_ << " needs the latents of videos, train.objective trajectory "
                "trains from contexts alone");
}

void ObjectiveSpec::prepare_stage(const Keys& k, teacher::TeacherStage& stage, std::int64_t text_dim,
                                  const data::TimestepRange& range, bool colocated, bool log) const {
  if (guided(k)) {
    const auto& t = k.teacher;
    stage.set_guidance(t.guidance, t.negative.empty() ? torch::Tensor() : load_negative_context(t.negative, text_dim));
    if (log) {
      const auto g = t.guidance.per_expert() ? fmt::format("g*(v_cond - v_neg), g {} for the low-noise expert and {} "
                                                           "for the high-noise one,", t.guidance.low, t.guidance.high)
                                             : fmt::format("{}*(v_cond - v_neg),", t.guidance.low);
      spdlog::info("train.objective {}: the teacher's velocity is v_neg + {} the negative context {}", name_, g,
                   t.negative.empty() ? std::string("zeros") : t.negative);
    }
  }
  if (log) log_teacher(k, range, colocated);
}

void ObjectiveSpec::shape_stream(const Keys& k, comm::StreamPlan& plan) const {
  plan.start_states = start_states(k);
  plan.train_targets = train_targets(k);
  plan.score_requests = traits_.real_score;
}

void ObjectiveSpec::shape_plan(const Keys& k, plan::PlanInput& in) const {
  in.teacher_forwards = guided(k) ? 2 : 1;  // [cond; neg] as one batch
  in.whole_teacher = !traits_.whole_teacher.empty();
}

std::unique_ptr<teacher::TrajectoryRounds> trajectory_rounds(const Keys& k, const teacher::SourceParts& parts) {
  WD_CHECK(parts.stage || parts.stored,
           "train.objective " << k.train.objective << ": its trajectories need a teacher stage on this rank");
  const auto& s = parts.samples;
  return std::make_unique<teacher::TrajectoryRounds>(
      teacher::TrajectorySource{parts.stage, s.reader, s.schedule, parts.plan, trajectory_spec(k, parts.range),
                                s.replica, s.replicas, s.per_replica, s.train_samples, k.train.seed, parts.stored,
                                parts.patch});
}

teacher::TrajectorySpec trajectory_spec(const Keys& k) {
  return {k.teacher.solver, k.teacher.steps, k.student.steps, k.teacher.shift};
}

teacher::TrajectorySpec trajectory_spec(const Keys& k, const data::TimestepRange& range) {
  auto spec = trajectory_spec(k);
  if (range.side != data::TimestepRange::kAll) spec.intervals = spec.intervals_in(range);
  return spec;
}

std::int64_t batches_per_round(const Keys& k, const data::TimestepRange& range) {
  return static_cast<std::int64_t>(trajectory_spec(k, range).trained().size());
}

const ObjectiveSpec& find(const std::string& name) {
  for (const auto& s : table()) {
    if (s->name() == name) return *s;
  }
  std::string list;
  for (const auto& n : names()) list += (list.empty() ? "" : ", ") + n;
  throw ConfigError("train.objective(" + name + ") must be one of " + list);
}

std::vector<std::string> names() {
  std::vector<std::string> out;
  for (const auto& s : table()) out.push_back(s->name());
  return out;
}

void add(std::unique_ptr<ObjectiveSpec> spec) {
  const auto taken = names();
  WD_CHECK_AS(ConfigError, std::find(taken.begin(), taken.end(), spec->name()) == taken.end(),
              "train.objective " << spec->name() << " is in the objective table already");
  table().push_back(std::move(spec));
}

void bind(OptionTable& t, std::string& field) {
  std::string help, listed;
  for (const auto& s : table()) {
    help += (help.empty() ? "" : " | ") + s->name() + " (" + s->summary() + ")";
    listed += (listed.empty() ? "" : " | ") + s->name();
  }
  // find's ConfigError (the name and every name of the table) stops the parse.
  t.bind_parsed<std::string>(
      "train.objective", field, [](const std::string& text) { return find(text).name(); },
      [](const std::string& name) { return name; }, help + "; docs/objectives.md (one of: " + listed + ")");
}

namespace {

/// data.teacher_cache: what a cache can stand for (check_cacheable), and no teacher rank, unless
/// the students ask a live teacher for their real score (dmd): then one answers it, a teacher rank
/// or each student's colocated teacher.
void check_cached(const Keys& k, ConfigProblems& p) {
  check_cacheable(k, p);
  const auto& active = find(k.train.objective);
  if (active.traits().real_score) {
    p.check(k.teacher.ranks >= 1 || k.teacher.placement == TeacherPlacement::kColocated,
            "data.teacher_cache with train.objective " + active.name() + ": the cache holds the training batches, "
            "the real score needs a live teacher answering the students' own samples: set teacher.ranks >= 1 (ranks "
            "that answer the real score alone) or teacher.placement colocated, not teacher.ranks " +
                std::to_string(k.teacher.ranks));
    return;
  }
  p.check(k.teacher.ranks == 0, "data.teacher_cache: the students read the teacher's batches from the cache, with no "
                                "teacher rank: set teacher.ranks 0, not " + std::to_string(k.teacher.ranks));
  p.check(k.teacher.placement != TeacherPlacement::kColocated,
          "data.teacher_cache: no rank computes the teacher; leave teacher.placement at auto, not colocated");
}

}  // namespace

void check_cacheable(const Keys& k, ConfigProblems& p) {
  const auto& active = find(k.train.objective);
  const auto cached = "a teacher cache (data.teacher_cache, generate) with train.objective " + active.name();
  const auto why = active.uncached(k);
  p.check(why.empty(), cached + why);
  p.check(k.student.features.empty(),
          cached + " and student.features(" + k.student.features + "): the cache holds no teacher features yet");
}

void check(const Keys& k, ConfigProblems& p) {
  const auto& active = find(k.train.objective);
  active.check(k, p);
  for (const auto& s : table()) {
    if (s.get() != &active) s->check_unused(k, active.name(), p);
  }
  if (k.teacher_cache) check_cached(k, p);
  if (!active.traits().needs_teacher) return;
  p.check(k.student.model_type.empty(),
          "student.model_type(" + k.student.model_type + ") sets the type of a student trained without a teacher; "
          "train.objective " + active.name() + "'s student takes its teacher's");
  std::string without;
  for (const auto& s : table()) {
    if (!s->traits().needs_teacher) without += (without.empty() ? "" : " or ") + s->name();
  }
  if (k.teacher_cache) return;
  p.check(k.teacher.ranks >= 1, "teacher.ranks(0) means no teacher, which only train.objective " + without +
                                    " trains without; train.objective(" + active.name() + ") needs teacher.ranks >= 1"
                                    " (or data.teacher_cache)");
}

}  // namespace wd::objective
