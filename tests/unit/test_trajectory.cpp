// train.objective trajectory's batches: each (trajectory, interval) pair's target jumps exactly
// to the next state of its trajectory, the chain of jumps lands where an independent sampling
// loop over the same teacher lands, every pair of a round is dealt once and batches mix
// intervals, a batch depends on its position only (resume), held-out rounds use the held-out
// contexts, and a two-expert teacher routes each forward by its own t across the boundary.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "comm/stream_plan.hpp"
#include "core/errors.hpp"
#include "data/dataset_info.hpp"
#include "data/dataset_reader.hpp"
#include "data/flow_sampler.hpp"
#include "data/synthetic_dataset.hpp"
#include "model/image_condition.hpp"
#include "model/wan_checkpoint.hpp"
#include "teacher/target_source.hpp"
#include "teacher/trajectory.hpp"
#include "test_util.hpp"

namespace wd::teacher::test_trajectory {
namespace {

constexpr std::int64_t kTrain = 20;  // samples [20, 24) are held out

struct Fixture {
  test::TempDir dir{"wd-trajectory"};
  WanConfig config = WanConfig::preset("tiny");
  data::DatasetInfo info;
  comm::StreamPlan plan;

  /// `condition`: a teacher of that model type (i2v: in_dim 2·C + 4) and a data set with its
  /// image conditions, 2 latent frames.
  explicit Fixture(ImageCondition condition = ImageCondition::kNone) {
    config.num_layers = 2;
    const auto C = config.out_dim;
    if (condition == ImageCondition::kI2v) {
      config.model_type = "i2v";
      config.in_dim = 2 * C + kI2vMaskChannels;
    } else if (condition == ImageCondition::kTi2v) {
      config.model_type = "ti2v";
    }
    write_random_wan_checkpoint(dir.str("teacher"), config, torch::kFloat, 1ull << 20, 7);
    data::SyntheticDatasetSpec spec;
    spec.output = dir.str("data.h5");
    spec.samples = 24;
    spec.latent = {C, condition == ImageCondition::kNone ? 1 : 2, 4, 4};
    spec.text_len = 5;
    spec.text_dim = config.text_dim;
    spec.seed = 2;
    spec.condition = condition;
    data::write_synthetic_dataset(spec);
    data::DatasetExpectations expect;
    if (condition != ImageCondition::kNone) expect = {C, config.text_dim, config.text_len, config.patch_size, condition};
    info = data::validate_dataset(spec.output, expect);
    plan.batch_per_student = 3;
    plan.eval_messages = 2;
    plan.train_steps = 10;
    plan.latent = info.latent_shape;
    // ti2v's per-token timesteps: 2 frames of (4/2)·(4/2) tokens.
    if (condition == ImageCondition::kTi2v) plan.per_token_seq_len = 8;
  }
  /// A two-expert stage: "teacher" below t 500, a second random model ("high") from t 500 up.
  TeacherStage two_experts() const {
    write_random_wan_checkpoint(dir.str("high"), config, torch::kFloat, 1ull << 20, 99);
    StageLoad how;
    how.dtype = torch::kFloat;
    how.blocks = {0, config.num_layers};
    std::vector<StageModel> models;
    models.push_back(load_stage_model(WanCheckpoint::open(dir.str("teacher")), how));
    models.push_back(load_stage_model(WanCheckpoint::open(dir.str("high")), how));
    Router router = [](const torch::Tensor& t) {  // t >= 500: the high-noise expert
      std::vector<std::vector<std::int64_t>> r(2);
      for (std::int64_t i = 0; i < t.size(0); ++i) r[t[i].item<float>() >= 500 ? 1 : 0].push_back(i);
      return r;
    };
    return TeacherStage(std::move(models), router, how.blocks, {});
  }
  TeacherStage stage(const std::string& name = "teacher") const {
    StageLoad how;
    how.dtype = torch::kFloat;
    how.blocks = {0, config.num_layers};
    std::vector<StageModel> models;
    models.push_back(load_stage_model(WanCheckpoint::open(dir.str(name)), how));
    return TeacherStage(std::move(models), nullptr, how.blocks, {});
  }
};

TrajectorySpec spec(std::int64_t teacher_steps, std::int64_t k, Solver solver = Solver::kUnipc,
                    double shift = 3.0) {
  return {solver, teacher_steps, k, shift};
}

/// One pair's training sample: the state, its t, the target velocity and the context.
struct Pair {
  torch::Tensor x, t, v, context;
};

/// Every pair of round 0, keyed by (trajectory, interval), read from the round's k batches.
std::map<std::pair<std::int64_t, std::int64_t>, Pair> round_pairs(TrajectoryRounds& rounds, std::int64_t B,
                                                                  std::int64_t k, bool eval = false) {
  std::map<std::pair<std::int64_t, std::int64_t>, Pair> pairs;
  for (std::int64_t slot = 0; slot < k; ++slot) {
    const auto b = rounds.make(slot, eval);
    for (std::int64_t s = 0; s < B; ++s) {
      const auto key = rounds.pair_at(0, eval, slot * B + s);
      EXPECT_TRUE(pairs.count(key) == 0) << "pair (" << key.first << "," << key.second << ") dealt twice";
      pairs[key] = {b.x_t[s], b.t[s], b.out[s], b.context[s]};
    }
  }
  return pairs;
}

/// `stage`'s velocity for one trajectory: state `x` [1,...] at σ with sample `b`'s context of `c`.
torch::Tensor velocity_of(TeacherStage& stage, const torch::Tensor& x, double sigma, const data::CleanBatch& c,
                          std::int64_t b) {
  StageBatch one;
  one.x_t = x;
  one.t = torch::full({1}, static_cast<float>(sigma * 1000));
  one.context = c.context.slice(0, b, b + 1);
  one.context_lens = c.context_lens.slice(0, b, b + 1);
  stage.run(one);
  return one.out;
}

TEST(Trajectory, StudentSigmasArePointsOfTheTeachersScheduleAndTheOfficialKStepOne) {
  const auto s = spec(40, 4);
  const auto teacher = s.teacher_sigmas(), student = s.student_sigmas();
  ASSERT_EQ(student.size(), 5u);
  for (std::size_t i = 0; i <= 4; ++i) EXPECT_EQ(student[i], teacher[i * 10]);
  const auto official = data::sampling_sigmas(4, 3.0);
  for (std::size_t i = 0; i <= 4; ++i) EXPECT_DOUBLE_EQ(student[i], official[i]);
  ConfigProblems p;
  spec(30, 4).validate(p);
  try {
    p.throw_if_any("t");
    FAIL() << "bad trajectory specs were accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(test::contains(e.what(), "teacher.steps(30) must be a multiple of student.steps(4)")) << e.what();
  }
}

TEST(Trajectory, JumpsChainIntoTheGuidedTeachersOwnSampledPath) {
  Fixture f;
  auto stage = f.stage();
  stage.set_guidance(2.5);
  data::DatasetReader reader(f.info);
  const data::SampleSchedule schedule(kTrain, 3, 1, 9);
  const std::int64_t B = 3, k = 4;
  const auto s = spec(8, k);
  TrajectoryRounds rounds({&stage, reader, schedule, f.plan, s, 0, 1, B, kTrain, 9});
  const auto pairs = round_pairs(rounds, B, k);
  ASSERT_EQ(pairs.size(), static_cast<std::size_t>(B * k));  // every pair once
  const auto sigmas = s.student_sigmas();
  const auto contexts = reader.read(schedule.indices(0, 0));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t i = 0; i < k; ++i) {
      const auto& p = pairs.at({b, i});
      EXPECT_FLOAT_EQ(p.t.item<float>(), static_cast<float>(1000 * sigmas[static_cast<std::size_t>(i)]));
      EXPECT_TRUE(torch::equal(p.context, contexts.context[b])) << "trajectory " << b;
      if (i + 1 < k) {  // the jump lands on the next interval's state
        const auto landed = p.x + (sigmas[static_cast<std::size_t>(i + 1)] - sigmas[static_cast<std::size_t>(i)]) * p.v;
        EXPECT_TRUE(torch::allclose(landed, pairs.at({b, i + 1}).x, 1e-5, 1e-5)) << "(" << b << "," << i << ")";
      }
    }
    // An independent loop: the same teacher, one trajectory at a time, the whole teacher schedule.
    const auto& last = pairs.at({b, k - 1});
    const auto end = last.x + (0.0 - sigmas[static_cast<std::size_t>(k - 1)]) * last.v;
    const auto want = data::sample_flow(s.solver, s.teacher_sigmas(), pairs.at({b, 0}).x.unsqueeze(0),
                                        [&](const torch::Tensor& x, double sigma) {
                                          return velocity_of(stage, x, sigma, contexts, b);
                                        });
    EXPECT_TRUE(torch::allclose(end, want[0], 1e-4, 1e-4)) << "trajectory " << b << ": max diff "
                                                           << (end - want[0]).abs().max().item<float>();
    EXPECT_GT((pairs.at({b, 0}).x - want[0]).abs().max().item<float>(), 0.1);  // it did move
  }
}

TEST(Trajectory, BatchesMixIntervalsAndTrajectoriesAndDependOnTheirPositionOnly) {
  Fixture f;
  auto stage = f.stage();
  data::DatasetReader reader(f.info);
  const data::SampleSchedule schedule(kTrain, 4, 1, 9);
  const std::int64_t B = 4, k = 2;
  TrajectoryRounds sequential({&stage, reader, schedule, f.plan, spec(4, k, Solver::kEuler), 0, 1, B, kTrain, 9});
  std::vector<StageBatch> seen;
  for (std::int64_t pos = 0; pos < 6; ++pos) seen.push_back(sequential.make(pos, false));
  // A resumed run starts mid-round: its own object recomputes the round.
  TrajectoryRounds resumed({&stage, reader, schedule, f.plan, spec(4, k, Solver::kEuler), 0, 1, B, kTrain, 9});
  for (std::int64_t pos : {5, 3}) {
    const auto b = resumed.make(pos, false);
    EXPECT_TRUE(torch::equal(b.x_t, seen[static_cast<std::size_t>(pos)].x_t)) << "position " << pos;
    EXPECT_TRUE(torch::equal(b.out, seen[static_cast<std::size_t>(pos)].out)) << "position " << pos;
  }
  // Over several rounds the deal puts more than one interval into some batch.
  bool mixed = false;
  for (std::int64_t round = 0; round < 3; ++round) {
    for (std::int64_t slot = 0; slot < k; ++slot) {
      std::set<std::int64_t> intervals;
      for (std::int64_t s = 0; s < B; ++s) intervals.insert(sequential.pair_at(round, false, slot * B + s).second);
      mixed = mixed || intervals.size() > 1;
    }
  }
  EXPECT_TRUE(mixed);
  // Another round, another noise: the first states differ.
  EXPECT_FALSE(torch::equal(seen[0].x_t, seen[2].x_t));
}

TEST(Trajectory, HeldOutRoundsUseTheHeldOutContexts) {
  Fixture f;
  auto stage = f.stage();
  data::DatasetReader reader(f.info);
  const data::SampleSchedule schedule(kTrain, 2, 1, 9);
  const std::int64_t B = 2, k = 2;
  TrajectoryRounds rounds({&stage, reader, schedule, f.plan, spec(2, k, Solver::kEuler), 0, 1, B, kTrain, 9});
  const auto pairs = round_pairs(rounds, B, k, true);
  const auto held_out = reader.read(eval_indices(0, 0, B, 1, kTrain));
  for (std::int64_t b = 0; b < B; ++b) {
    EXPECT_TRUE(torch::equal(pairs.at({b, 0}).context, held_out.context[b])) << "trajectory " << b;
  }
  EXPECT_FALSE(torch::equal(rounds.make(0, true).x_t, rounds.make(0, false).x_t));
}

TEST(Trajectory, AnExpertsStudentGetsTheIntervalsStartingInItsRangeCutFromTheSameTrajectories) {
  Fixture f;
  auto stage = f.stage();
  data::DatasetReader reader(f.info);
  const data::SampleSchedule schedule(kTrain, 2, 1, 9);
  const std::int64_t B = 2, k = 4;
  auto s = spec(8, k, Solver::kEuler, 1.0);  // intervals start at t = 999, 749.25, 499.5, 249.75 (as above)
  const data::TimestepRange high{data::TimestepRange::kHigh, 500.0}, low{data::TimestepRange::kLow, 500.0};
  EXPECT_EQ(s.intervals_in(high), (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(s.intervals_in(low), (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(s.intervals_in({}), (std::vector<std::int64_t>{0, 1, 2, 3}));
  EXPECT_THROW(static_cast<void>(s.intervals_in({data::TimestepRange::kHigh, 999.9})), ConfigError);

  TrajectoryRounds all({&stage, reader, schedule, f.plan, s, 0, 1, B, kTrain, 9});
  const auto every = round_pairs(all, B, k);
  for (const auto& range : {high, low}) {
    auto cut = s;
    cut.intervals = s.intervals_in(range);
    TrajectoryRounds rounds({&stage, reader, schedule, f.plan, cut, 0, 1, B, kTrain, 9});
    const auto m = static_cast<std::int64_t>(cut.intervals.size());
    const auto pairs = round_pairs(rounds, B, m);
    EXPECT_EQ(static_cast<std::int64_t>(pairs.size()), B * m);  // every (trajectory, trained interval) once
    for (const auto& [key, pair] : pairs) {
      EXPECT_TRUE(range.contains(pair.t.item<float>())) << "interval " << key.second;
      // The same trajectories as the uncut stream's (same noise, same teacher), cut.
      EXPECT_TRUE(torch::equal(pair.x, every.at(key).x)) << "pair " << key.first << "," << key.second;
      EXPECT_TRUE(torch::allclose(pair.v, every.at(key).v, 1e-6, 1e-6));
    }
    // Round 1 follows m positions later.
    const auto next = rounds.make(m, false);
    EXPECT_FALSE(torch::equal(next.x_t, rounds.make(0, false).x_t));
  }
}

TEST(Trajectory, TwoExpertTeacherRoutesEveryForwardByItsOwnTAcrossTheBoundary) {
  Fixture f;
  auto moe = f.two_experts();
  auto low = f.stage("teacher"), high = f.stage("high");
  data::DatasetReader reader(f.info);
  const data::SampleSchedule schedule(kTrain, 2, 1, 9);
  const std::int64_t B = 2, k = 2;
  const auto s = spec(4, k, Solver::kEuler, 1.0);  // t = 999, 749.25, 499.5, 249.75: two forwards on each side
  TrajectoryRounds rounds({&moe, reader, schedule, f.plan, s, 0, 1, B, kTrain, 9});
  const auto pairs = round_pairs(rounds, B, k);
  const auto contexts = reader.read(schedule.indices(0, 0));
  const auto sigmas = s.teacher_sigmas();
  for (std::int64_t b = 0; b < B; ++b) {
    // `routed`: each forward by its own t; otherwise the low-noise expert throughout, which must
    // land elsewhere (both experts matter).
    const auto run = [&](bool routed) {
      return data::sample_flow(Solver::kEuler, sigmas, pairs.at({b, 0}).x.unsqueeze(0), [&](const torch::Tensor& x, double sigma) {
        return velocity_of(routed && sigma * 1000 >= 500 ? high : low, x, sigma, contexts, b);
      });
    };
    const auto& last = pairs.at({b, k - 1});
    const auto end = last.x - s.student_sigmas()[static_cast<std::size_t>(k - 1)] * last.v;
    EXPECT_TRUE(torch::allclose(end, run(true)[0], 1e-4, 1e-4)) << "trajectory " << b;
    EXPECT_FALSE(torch::allclose(end, run(false)[0], 1e-3, 1e-3)) << "trajectory " << b;
  }
}

// Per-expert guidance (teacher.guidance LOW,HIGH; the official T2V-A14B samples with 3,4): each
// sample of a two-expert stage's guided forward takes the scale of the expert its t routes it
// to, which one scale cannot reproduce; one expert refuses two scales.
TEST(Trajectory, PerExpertGuidanceGivesEachSampleItsExpertsScale) {
  Fixture f;
  auto moe = f.two_experts();
  moe.set_guidance({3.0, 4.0});
  data::DatasetReader reader(f.info);
  const auto c = reader.read({0, 1});
  StageBatch both;
  both.x_t = torch::randn({2, f.config.out_dim, 1, 4, 4});
  both.t = torch::tensor({800.f, 300.f});  // sample 0: high-noise, sample 1: low-noise
  both.context = c.context;
  both.context_lens = c.context_lens;
  moe.run(both);
  // Each sample alone through its own expert, guided with that expert's scale.
  const auto alone = [&](const std::string& name, double g, std::int64_t b) {
    auto stage = f.stage(name);
    stage.set_guidance(g);
    StageBatch one;
    one.x_t = both.x_t.slice(0, b, b + 1);
    one.t = both.t.slice(0, b, b + 1);
    one.context = c.context.slice(0, b, b + 1);
    one.context_lens = c.context_lens.slice(0, b, b + 1);
    stage.run(one);
    return one.out[0];
  };
  EXPECT_TRUE(torch::allclose(both.out[0], alone("high", 4.0, 0), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(both.out[1], alone("teacher", 3.0, 1), 1e-5, 1e-5));
  EXPECT_FALSE(torch::allclose(both.out[0], alone("high", 3.0, 0), 1e-3, 1e-3));  // the scale matters
  auto one = f.stage();
  try {
    one.set_guidance({3.0, 4.0});
    FAIL() << "a one-expert teacher took two scales";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(test::contains(e.what(), "teacher.guidance(3,4) gives each expert of a two-expert teacher its own "
                                         "scale; this teacher has one"))
        << e.what();
  }
  EXPECT_EQ(GuidanceScale::parse("teacher.guidance", "3,4").str(), "3,4");
  EXPECT_EQ(GuidanceScale::parse("teacher.guidance", "3.5").str(), "3.5");
  EXPECT_FALSE(GuidanceScale::parse("teacher.guidance", "3.5").per_expert());
  EXPECT_THROW(GuidanceScale::parse("teacher.guidance", "3,"), ConfigError);
  EXPECT_THROW(GuidanceScale::parse("teacher.guidance", "-1"), ConfigError);
}

/// The pairs of round 0 with the y of each (i2v), keyed by (trajectory, interval).
std::map<std::pair<std::int64_t, std::int64_t>, torch::Tensor> round_ys(TrajectoryRounds& rounds, std::int64_t B,
                                                                        std::int64_t k) {
  std::map<std::pair<std::int64_t, std::int64_t>, torch::Tensor> ys;
  for (std::int64_t slot = 0; slot < k; ++slot) {
    const auto b = rounds.make(slot, false);
    EXPECT_TRUE(b.y.defined());
    if (!b.y.defined()) return ys;
    for (std::int64_t s = 0; s < B; ++s) ys[rounds.pair_at(0, false, slot * B + s)] = b.y[s];
  }
  return ys;
}

TEST(Trajectory, AnI2vTeachersTrajectoriesTakeEachSamplesImageAtEveryForward) {
  Fixture f(ImageCondition::kI2v);
  auto stage = f.stage();
  data::DatasetReader reader(f.info);
  const data::SampleSchedule schedule(kTrain, 2, 1, 9);
  const std::int64_t B = 2, k = 2;
  const auto s = spec(4, k);
  TrajectoryRounds rounds({&stage, reader, schedule, f.plan, s, 0, 1, B, kTrain, 9});
  const auto pairs = round_pairs(rounds, B, k);
  const auto ys = round_ys(rounds, B, k);
  const auto clean = reader.read(schedule.indices(0, 0));
  ASSERT_TRUE(clean.condition.defined());
  const auto sigmas = s.student_sigmas();
  for (std::int64_t b = 0; b < B; ++b) {
    const auto y = i2v_condition(clean.condition.slice(0, b, b + 1));
    for (std::int64_t i = 0; i < k; ++i) EXPECT_TRUE(torch::equal(ys.at({b, i}), y[0])) << "(" << b << "," << i << ")";
    // An independent loop with y at every forward lands where the jumps do; without y it cannot run.
    const auto& last = pairs.at({b, k - 1});
    const auto end = last.x - sigmas[static_cast<std::size_t>(k - 1)] * last.v;
    const auto want = data::sample_flow(s.solver, s.teacher_sigmas(), pairs.at({b, 0}).x.unsqueeze(0),
                                        [&](const torch::Tensor& x, double sigma) {
                                          StageBatch one;
                                          one.x_t = x;
                                          one.t = torch::full({1}, static_cast<float>(sigma * 1000));
                                          one.context = clean.context.slice(0, b, b + 1);
                                          one.context_lens = clean.context_lens.slice(0, b, b + 1);
                                          one.y = y;
                                          stage.run(one);
                                          return one.out;
                                        });
    EXPECT_TRUE(torch::allclose(end, want[0], 1e-4, 1e-4)) << "trajectory " << b << ": max diff "
                                                           << (end - want[0]).abs().max().item<float>();
  }
}

TEST(Trajectory, ATi2vTeachersTrajectoriesKeepTheImageAsTheirCleanFirstFrame) {
  Fixture f(ImageCondition::kTi2v);
  auto stage = f.stage();
  data::DatasetReader reader(f.info);
  const data::SampleSchedule schedule(kTrain, 2, 1, 9);
  const std::int64_t B = 2, k = 2;
  const auto s = spec(4, k);
  TrajectoryRounds rounds({&stage, reader, schedule, f.plan, s, 0, 1, B, kTrain, 9});
  const auto pairs = round_pairs(rounds, B, k);
  const auto clean = reader.read(schedule.indices(0, 0));
  ASSERT_TRUE(clean.condition.defined());
  const auto sigmas = s.student_sigmas();
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t i = 0; i < k; ++i) {
      const auto& p = pairs.at({b, i});
      const auto at = "(" + std::to_string(b) + "," + std::to_string(i) + ")";
      EXPECT_TRUE(torch::equal(p.x.narrow(1, 0, 1), clean.condition[b])) << at;  // the image, at every state
      EXPECT_TRUE(torch::equal(p.v.narrow(1, 0, 1), torch::zeros_like(clean.condition[b]))) << at;  // never moves
      ASSERT_EQ(p.t.sizes(), torch::IntArrayRef({8}));
      EXPECT_TRUE(torch::equal(p.t.narrow(0, 0, 4), torch::zeros({4}))) << at;  // frame 0's tokens at t = 0
      EXPECT_TRUE(torch::equal(p.t.narrow(0, 4, 4), torch::full({4}, static_cast<float>(1000 * sigmas[static_cast<std::size_t>(i)]))))
          << at;
    }
    EXPECT_GT((pairs.at({b, 0}).x - pairs.at({b, 1}).x).abs().max().item<float>(), 0.01);  // the rest moves
  }
}

/// Whole rounds as a cache of trajectories stores them (generate --keep), kept in memory: the
/// rounds `from` samples to their end, K + 1 states each.
class Kept final : public StoredTrajectories {
 public:
  Kept(TrajectoryRounds& from, std::int64_t keep) : from_(from), keep_(keep) {}
  std::int64_t intervals() const override { return keep_; }
  torch::Tensor round(std::int64_t r, bool eval) override { return from_.whole_round(r, eval, keep_); }

 private:
  TrajectoryRounds& from_;
  std::int64_t keep_;
};

void expect_same_batches(TrajectoryRounds& a, TrajectoryRounds& b, std::int64_t positions, bool eval) {
  for (std::int64_t pos = 0; pos < positions; ++pos) {
    const auto x = a.make(pos, eval), y = b.make(pos, eval);
    const auto at = std::string(eval ? "held-out " : "") + "position " + std::to_string(pos);
    EXPECT_TRUE(torch::equal(x.x_t, y.x_t)) << at;
    EXPECT_TRUE(torch::equal(x.out, y.out)) << at;
    EXPECT_TRUE(torch::equal(x.t, y.t)) << at;
    EXPECT_TRUE(torch::equal(x.context, y.context)) << at;
    EXPECT_TRUE(torch::equal(x.context_lens, y.context_lens)) << at;
    ASSERT_EQ(x.start.defined(), y.start.defined()) << at;
    if (x.start.defined()) EXPECT_TRUE(torch::equal(x.start, y.start)) << at;
  }
}

TEST(Trajectory, StoredWholeTrajectoriesDealTheBatchesOfEveryStudentStepsBitForBit) {
  Fixture f;
  f.plan.start_states = true;  // a roll-out student's x_start rides along
  auto stage = f.stage();
  stage.set_guidance(2.5);
  data::DatasetReader reader(f.info);
  const data::SampleSchedule schedule(kTrain, 3, 1, 9);
  const std::int64_t B = 3;
  // One sampler of whole trajectories (8 steps, all 9 states kept) stands for the cache.
  TrajectoryRounds sampler({&stage, reader, schedule, f.plan, spec(8, 4), 0, 1, B, kTrain, 9});
  Kept all(sampler, 8);
  for (const std::int64_t k : {4, 2, 8}) {
    SCOPED_TRACE("student.steps " + std::to_string(k));
    TrajectoryRounds online({&stage, reader, schedule, f.plan, spec(8, k), 0, 1, B, kTrain, 9});
    // No teacher: the stored states, dealt as online.
    TrajectoryRounds stored({nullptr, reader, schedule, f.plan, spec(8, k), 0, 1, B, kTrain, 9, &all, {1, 2, 2}});
    expect_same_batches(online, stored, 2 * k + 1, false);
    expect_same_batches(online, stored, 2, true);
  }
  // student.expert's cut (the first two of four intervals): the same.
  auto cut = spec(8, 4);
  cut.intervals = {0, 1};
  TrajectoryRounds online({&stage, reader, schedule, f.plan, cut, 0, 1, B, kTrain, 9});
  TrajectoryRounds stored({nullptr, reader, schedule, f.plan, cut, 0, 1, B, kTrain, 9, &all, {1, 2, 2}});
  expect_same_batches(online, stored, 5, false);
  // Four intervals stored (5 states) serve students of 4, 2 and 1 steps, not 8.
  Kept four(sampler, 4);
  TrajectoryRounds two({nullptr, reader, schedule, f.plan, spec(8, 2), 0, 1, B, kTrain, 9, &four, {1, 2, 2}});
  TrajectoryRounds two_online({&stage, reader, schedule, f.plan, spec(8, 2), 0, 1, B, kTrain, 9});
  expect_same_batches(two_online, two, 3, false);
  try {
    TrajectoryRounds eight({nullptr, reader, schedule, f.plan, spec(8, 8), 0, 1, B, kTrain, 9, &four, {1, 2, 2}});
    FAIL() << "a student of 8 steps was dealt from 4 stored intervals";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(test::contains(e.what(), "stored trajectories of 4 intervals serve students whose student.steps "
                                         "divides 4 (teacher.steps 8), not student.steps 8"))
        << e.what();
  }
}

}  // namespace
}  // namespace wd::teacher::test_trajectory
