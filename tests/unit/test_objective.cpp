// The objective wing (src/objective): the table binds train.objective at parse and lists its
// names in --help; each built-in spec answers what the run config's predicates answered before
// the wing (a table of expected answers); and a sixth objective, defined here alone, is added to
// the table from this test binary and is parsed, checked and costed with no edit outside
// src/objective and this file: parsed, checked, costed, and its own source makes its batches.
#include <gtest/gtest.h>

#include <sstream>

#include "comm/stream_plan.hpp"
#include "core/config.hpp"
#include "core/errors.hpp"
#include "data/dataset_info.hpp"
#include "data/synthetic_dataset.hpp"
#include "job/run_config.hpp"
#include "model/wan_checkpoint.hpp"
#include "objective/objective_spec.hpp"
#include "plan/planner.hpp"
#include "teacher/target_source.hpp"
#include "run_config_words.hpp"
#include "test_util.hpp"

namespace wd::test_objective {
namespace {

using job::RunConfig;

/// x0's batches: the data and the teacher's velocity v (the built-in source), then the target
/// x_t − σ·v with σ = t / 1000.
class X0Targets final : public teacher::TargetSource {
 public:
  explicit X0Targets(std::unique_ptr<teacher::TargetSource> velocity) : velocity_(std::move(velocity)) {}
  teacher::StageBatch make(std::int64_t position, bool eval) override {
    auto b = velocity_->make(position, eval);
    b.out = b.x_t - (b.t / 1000.0).view({-1, 1, 1, 1, 1}) * b.out;
    return b;
  }

 private:
  std::unique_ptr<teacher::TargetSource> velocity_;
};

/// A test-only objective: the teacher's clean-sample prediction x0 = x_t − σ·v as the target.
/// One teacher forward a sample, never guided, any placement; teacher.guidance must stay 1.
class TeacherX0 final : public objective::ObjectiveSpec {
 public:
  TeacherX0() : ObjectiveSpec("x0", "test only: the teacher's clean-sample prediction as the target", {}) {}
  void check(const objective::Keys& k, ConfigProblems& p) const override {
    p.check(k.teacher.guidance.is_one(), "train.objective x0 takes the teacher's unguided x0: teacher.guidance must be 1");
  }
  std::unique_ptr<teacher::TargetSource> source(const objective::Keys& k,
                                                const teacher::SourceParts& parts) const override {
    return std::make_unique<X0Targets>(ObjectiveSpec::source(k, parts));
  }
};

/// Adds the sixth objective before any test parses options.
class AddTeacherX0 : public ::testing::Environment {
 public:
  void SetUp() override { objective::add(std::make_unique<TeacherX0>()); }
};
const auto* const kAdded = ::testing::AddGlobalTestEnvironment(new AddTeacherX0);

/// A run config as `train` parses these words.
RunConfig config(const std::string& words) { return test::run_config(words); }

/// `train --help`'s option table with its line wrapping undone (runs of blanks as one space).
std::string help() {
  RunConfig cfg;
  OptionTable table("train");
  cfg.bind(table);
  std::ostringstream os;
  os << table.description();
  std::string flat;
  for (const char c : os.str()) {
    const bool blank = c == ' ' || c == '\n';
    if (!blank || (!flat.empty() && flat.back() != ' ')) flat += blank ? ' ' : c;
  }
  return flat;
}

TEST(ObjectiveTable, ListsTheBuiltInObjectivesFirstThenTheAddedOne) {
  EXPECT_EQ(objective::names(), (std::vector<std::string>{"velocity", "guided", "flow", "trajectory", "dmd", "x0"}));
}

TEST(ObjectiveTable, ANameOutsideTheTableIsAConfigErrorAtParse) {
  try {
    config("--train.objective distil");
    FAIL() << "train.objective distil was accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(test::contains(e.what(), "train.objective(distil) must be one of velocity, guided, flow, trajectory, "
                                         "dmd, x0"))
        << e.what();
  }
  EXPECT_THROW(objective::find("Velocity"), ConfigError);
  EXPECT_THROW(objective::add(std::make_unique<TeacherX0>()), ConfigError) << "a name already in the table";
}

TEST(ObjectiveTable, HelpListsEveryNameFromTheTable) {
  const auto text = help();
  for (const auto& name : objective::names()) {
    EXPECT_TRUE(test::contains(text, "(one of: velocity | guided | flow | trajectory | dmd | x0)")) << text;
    EXPECT_TRUE(test::contains(text, name + " (")) << name;
  }
  EXPECT_TRUE(test::contains(text, "x0 (test only: the teacher's clean-sample prediction as the target)"));
}

/// What RunConfig's predicates answered at 13ac36a for one objective and keys (the answers of
/// its hand-written predicates, now asked of the spec).
struct Expected {
  std::string words;
  bool has_teacher, whole_teacher, guided, trajectory_stream, needs_latents, train_targets, start_states;
  double teacher_forwards;
  std::string solver;  ///< the sampling probe's
};

TEST(ObjectiveTable, EachBuiltInAnswersWhatTheRunConfigsPredicatesAnswered) {
  const std::vector<Expected> table{
      {"", true, false, false, false, true, true, false, 1.0, "unipc"},
      {"--train.objective guided", true, true, true, false, true, true, false, 2.0, "unipc"},
      {"--train.objective guided --teacher.guidance 1", true, true, true, false, true, true, false, 2.0, "unipc"},
      {"--train.objective flow --teacher.ranks 0", false, false, false, false, true, true, false, 1.0, "unipc"},
      {"--train.objective trajectory --teacher.guidance 1 --teacher.steps 8 --student.steps 2", true, true, false, true,
       false, true, false, 4.0, "euler"},
      {"--train.objective trajectory --teacher.guidance 3 --teacher.steps 8 --student.steps 2 "
       "--train.trajectory_rollout 0.5",
       true, true, true, true, false, true, true, 8.0, "euler"},
      {"--train.objective dmd --teacher.guidance 3 --train.critic_ratio 4", true, true, true, false, true, false, false,
       0.5, "euler"},
      {"--train.objective dmd --teacher.guidance 1 --train.critic_ratio 4 --train.dmd_regression_weight 0.5 "
       "--teacher.steps 8 --student.steps 2",
       true, true, false, true, false, true, false, 4.25, "euler"},
      {"--train.objective x0 --teacher.guidance 1", true, false, false, false, true, true, false, 1.0, "unipc"},
  };
  for (const auto& e : table) {
    SCOPED_TRACE(e.words);
    const auto cfg = config(e.words);
    EXPECT_NO_THROW(cfg.validate());
    const auto& spec = cfg.objective();
    EXPECT_EQ(cfg.has_teacher(), e.has_teacher);
    EXPECT_EQ(spec.guided(cfg.keys()), e.guided);
    EXPECT_EQ(spec.trajectory_stream(cfg.keys()), e.trajectory_stream);
    EXPECT_EQ(spec.reaches_every_expert(cfg.keys()), e.trajectory_stream || spec.name() == "dmd");
    EXPECT_EQ(spec.needs_latents(cfg.keys()), e.needs_latents);
    // What the planner and the stream's plan take from it.
    plan::PlanInput in;
    spec.shape_plan(cfg.keys(), in);
    EXPECT_EQ(in.whole_teacher, e.whole_teacher);
    EXPECT_EQ(in.teacher_forwards, e.guided ? 2 : 1);
    comm::StreamPlan stream;
    spec.shape_stream(cfg.keys(), stream);
    EXPECT_EQ(stream.train_targets, e.train_targets);
    EXPECT_EQ(stream.start_states, e.start_states);
    EXPECT_EQ(stream.score_requests, spec.name() == "dmd");
    EXPECT_DOUBLE_EQ(cfg.teacher_forwards(), e.teacher_forwards);
    const auto loop = cfg.student_train();
    EXPECT_EQ(name_of(loop.sample_solver), e.solver);
    EXPECT_EQ(loop.interval_metrics, e.trajectory_stream);
    if (spec.traits().few_step) {
      EXPECT_EQ(loop.sample_steps, cfg.student.steps);
      EXPECT_EQ(loop.sample_shift, cfg.teacher.shift);
    } else {
      EXPECT_EQ(loop.sample_steps, cfg.train.sample_steps);
    }
  }
}

TEST(ObjectiveTable, EachSpecChecksItsOwnKeysAndRefusesThemUnderAnother) {
  const auto problems = [](const std::string& words) {
    try {
      config(words).validate();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Another objective's keys, each named with the objective that trains.
  EXPECT_TRUE(test::contains(problems("--train.objective guided --train.trajectory_rollout 0.5"),
                             "train.trajectory_rollout(0.5) rolls the student out along teacher trajectories: it needs "
                             "train.objective trajectory, not guided"));
  EXPECT_TRUE(test::contains(problems("--train.cond_dropout 0.1"),
                             "train.cond_dropout(0.1) drops contexts of the data: it needs train.objective flow, not "
                             "velocity"));
  EXPECT_TRUE(test::contains(problems("--train.objective x0 --critic.gan_weight 0.01"),
                             "critic.gan_weight(0.01) weighs a term of train.objective dmd's losses, not x0"));
  // The sixth objective's own check, and the teacher every objective but flow needs.
  EXPECT_TRUE(test::contains(problems("--train.objective x0 --teacher.guidance 3"),
                             "train.objective x0 takes the teacher's unguided x0: teacher.guidance must be 1"));
  EXPECT_TRUE(test::contains(problems("--train.objective x0 --teacher.ranks 0"),
                             "teacher.ranks(0) means no teacher, which only train.objective flow trains without; "
                             "train.objective(x0) needs teacher.ranks >= 1"));
  // dmd's own limits, from its spec.
  EXPECT_TRUE(test::contains(problems("--train.objective dmd --train.grad_accum 2"),
                             "train.objective dmd takes one micro-batch a step: train.grad_accum(2) must be 1"));
  EXPECT_TRUE(test::contains(problems("--train.objective dmd --critic.dim 32 --critic.init random --student.lora_rank 4"),
                             "critic.dim, ffn_dim, num_heads and num_layers size a full critic"));
  EXPECT_EQ(problems("--train.objective dmd --critic.dim 32 --critic.init random"), "");
}

TEST(ObjectiveTable, CostsComeFromTheSpec) {
  // trajectory with roll-out: a sample at interval i takes i jumps, i uniform over k = 4.
  const auto traj = config("--train.objective trajectory --student.steps 4 --train.trajectory_rollout 0.5");
  EXPECT_DOUBLE_EQ(traj.objective().student_extra_forwards(traj.keys(), 1.0), 0.5 * 3 / 2.0);
  // dmd, data start: one jump; R = 2; GAN on both sides.
  const auto dmd = config("--train.objective dmd --train.dmd_start data --train.critic_ratio 2 --critic.gan_weight 0.01 "
                          "--train.gan_weight 0.003");
  EXPECT_DOUBLE_EQ(dmd.objective().student_extra_forwards(dmd.keys(), 1.0), (1 + 3.0 / 2) + (3 + 0.5 + 6 + 1.5) - 3);
  const auto x0 = config("--train.objective x0");
  EXPECT_DOUBLE_EQ(x0.objective().student_extra_forwards(x0.keys(), 1.0), 0.0);
  EXPECT_DOUBLE_EQ(x0.objective().requests(x0.keys()), 0.0);
}

TEST(ObjectiveTable, TheAddedObjectivesSourceMakesItsOwnTargetsFromTheTeachersForward) {
  test::TempDir dir{"wd-objective-source"};
  auto model = WanConfig::preset("tiny");
  model.num_layers = 2;
  write_random_wan_checkpoint(dir.str("teacher"), model, torch::kFloat, 1ull << 20, 7);
  data::SyntheticDatasetSpec spec;
  spec.output = dir.str("data.h5");
  spec.samples = 12;
  spec.latent = {model.in_dim, 1, 4, 4};
  spec.text_len = 5;
  spec.text_dim = model.text_dim;
  data::write_synthetic_dataset(spec);
  const auto info = data::validate_dataset(spec.output, {});
  comm::StreamPlan plan;
  plan.batch_per_student = 2;
  plan.eval_messages = 1;
  plan.train_steps = 4;
  plan.latent = info.latent_shape;
  teacher::StageLoad how;
  how.dtype = torch::kFloat;
  how.blocks = {0, model.num_layers};
  std::vector<teacher::StageModel> models;
  models.push_back(teacher::load_stage_model(WanCheckpoint::open(dir.str("teacher")), how));
  teacher::TeacherStage stage(std::move(models), nullptr, how.blocks, {});
  data::DatasetReader reader(info);
  const data::SampleSchedule schedule(10, 2, 1, 3);
  const data::NoiseConfig noise;
  const data::FlowMatchingNoiser noiser(noise, 3), eval_noiser(noise, 4);
  const teacher::SourceParts parts{{reader, schedule, noiser, eval_noiser, 0, 1, 2, 10}, &stage, plan};

  const auto cfg = config("--train.objective x0 --teacher.guidance 1");
  const auto x0 = cfg.objective().source(cfg.keys(), parts);
  const auto velocity = objective::find("velocity").source(cfg.keys(), parts);
  teacher::LocalReceiver receiver("x0 teacher", *x0, plan, torch::kCPU, true);
  for (std::int64_t step = 0; step < 3; ++step) {  // the held-out message, then two training batches
    const auto at = teacher::stream_position(plan, step);
    const auto v = velocity->make(at.position, at.eval);
    const auto& m = receiver.recv(step);
    ASSERT_TRUE(torch::equal(m.at("x_t"), v.x_t)) << "step " << step;
    const auto sigma = (v.t / 1000.0).view({-1, 1, 1, 1, 1});
    EXPECT_TRUE(torch::allclose(m.at("teacher_out"), v.x_t - sigma * v.out, 1e-6, 1e-6)) << "step " << step;
    EXPECT_FALSE(torch::allclose(m.at("teacher_out"), v.out)) << "the target is x0, not the velocity";
    receiver.release(step);
  }
}

}  // namespace
}  // namespace wd::test_objective
