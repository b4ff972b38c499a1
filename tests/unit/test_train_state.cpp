// Training state: N steps + save + load into fresh parts + N steps equals 2N steps bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include "core/checkpoint_store.hpp"
#include "core/errors.hpp"
#include "core/torch_compat.hpp"
#include "student/distill_objective.hpp"
#include "student/train_state.hpp"
#include "student/train_step.hpp"
#include "student_batches.hpp"
#include "test_util.hpp"

namespace wd::student {
namespace {

namespace fs = std::filesystem;

WanConfig small(std::int64_t dim = 32) {
  WanConfig c = WanConfig::preset("tiny");
  c.dim = dim;
  c.num_heads = 2;
  c.ffn_dim = 48;
  c.num_layers = 2;
  c.text_dim = 8;
  c.text_len = 5;
  c.freq_dim = 16;
  c.in_dim = 6;  // != the teacher's 4 channels: projections are trained too
  c.out_dim = 2;
  return c;
}

using testing::batch;
using testing::slice;

const CheckpointPolicy kOff = CheckpointPolicy::parse("off");

struct Options {
  bool mixed = false;
  bool amsgrad = false;
  std::int64_t dim = 32;
  std::vector<std::pair<std::int64_t, std::int64_t>> features{{0, 1}};
};

/// Student parts and their AdamW, built like the student loop builds them. `init_seed` seeds
/// the DiT and (through the global generator) the feature heads.
struct Trainee {
  Trainee(const Options& o, std::uint64_t init_seed) {
    PartsSetup s;
    s.teacher_in_channels = 4;
    s.teacher_out_channels = 4;
    s.teacher_dim = 24;
    s.feature_pairs = o.features;
    s.feature_weight = 0.5;
    s.mixed_bf16 = o.mixed;
    s.seed = init_seed;
    torch::manual_seed(init_seed);
    parts = std::make_unique<StudentParts>(WanDiT(small(o.dim), WanInit::kRandom, torch::kFloat, init_seed), s);
    optimizer = std::make_unique<torch::optim::AdamW>(
        parts->trainable(),
        torch::optim::AdamWOptions(1e-2).betas({0.9, 0.99}).weight_decay(0.05).amsgrad(o.amsgrad));
  }

  /// One optimizer step of two micro-batches, the student loop's train_step. The inputs get
  /// noise from the global generator, so a resume is exact only if that generator is restored.
  double step(std::int64_t step) {
    auto b = batch(2, 100 + static_cast<std::uint64_t>(step));
    b["x_t"] = b["x_t"] + 0.1 * torch::randn_like(b["x_t"]);
    FixedBatches micro({slice(b, 0, 1), slice(b, 1, 2)});
    DistillObjective objective(*parts, kOff);
    StepContext context{objective, *optimizer};
    return train_step(context, step, 1e-2 / (1.0 + step), micro);
  }

  const torch::optim::AdamWParamState& state(std::size_t i) const {
    const auto it = optimizer->state().find(compat::optimizer_state_key(parts->trainable()[i]));
    EXPECT_NE(it, optimizer->state().end()) << parts->trainable_names()[i];
    return static_cast<const torch::optim::AdamWParamState&>(*it->second);
  }

  std::unique_ptr<StudentParts> parts;
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

void expect_exact_resume(const Options& o) {
  constexpr std::int64_t kHalf = 3;
  Trainee straight(o, 7);
  torch::manual_seed(11);
  std::vector<double> expected;
  for (std::int64_t s = 0; s < 2 * kHalf; ++s) expected.push_back(straight.step(s));

  test::TempDir tmp("wd-train-state");
  CheckpointStore store(tmp.str("checkpoints"));
  std::vector<double> losses;
  std::string saved;
  {
    Trainee first(o, 7);
    torch::manual_seed(11);
    for (std::int64_t s = 0; s < kHalf; ++s) losses.push_back(first.step(s));
    saved = store.save(kHalf, [&](const std::string& dir) {
      save_train_state(dir, *first.parts, *first.optimizer, TrainCursor{kHalf}, "[train]\nsteps = 6\n");
    });
  }
  // As a new process would be: other initial weights, the generator elsewhere.
  Trainee resumed(o, 99);
  torch::randn({17});
  ASSERT_EQ(store.latest_good()->path, saved);
  const auto cursor = load_train_state(saved, *resumed.parts, *resumed.optimizer);
  EXPECT_EQ(cursor.step, kHalf);
  for (std::int64_t s = cursor.step; s < 2 * kHalf; ++s) losses.push_back(resumed.step(s));

  ASSERT_EQ(losses.size(), expected.size());
  for (std::size_t s = 0; s < losses.size(); ++s) EXPECT_EQ(losses[s], expected[s]) << "step " << s;
  const auto& a = straight.parts->trainable();
  const auto& b = resumed.parts->trainable();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto& name = straight.parts->trainable_names()[i];
    EXPECT_TRUE(torch::equal(a[i], b[i])) << name;
    const auto& sa = straight.state(i);
    const auto& sb = resumed.state(i);
    EXPECT_EQ(sa.step(), sb.step()) << name;
    EXPECT_TRUE(torch::equal(sa.exp_avg(), sb.exp_avg())) << name;
    EXPECT_TRUE(torch::equal(sa.exp_avg_sq(), sb.exp_avg_sq())) << name;
    EXPECT_EQ(sa.max_exp_avg_sq().defined(), o.amsgrad) << name;
    if (o.amsgrad) {
      EXPECT_TRUE(torch::equal(sa.max_exp_avg_sq(), sb.max_exp_avg_sq())) << name;
    }
  }
  // The compute copy (bf16 in mixed precision) follows: predictions agree exactly.
  const auto probe = batch(2, 5);
  EXPECT_TRUE(torch::equal(straight.parts->predict(probe), resumed.parts->predict(probe)));

  std::ifstream ini(saved + "/config.ini");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(ini), {}), "[train]\nsteps = 6\n");
  EXPECT_TRUE(fs::exists(saved + "/student/config.json"));
  EXPECT_TRUE(fs::exists(saved + "/student/distill_heads/heads.safetensors"));
}

TEST(TrainState, ResumeIsExactInFp32WithAmsgrad) { expect_exact_resume({false, true}); }

TEST(TrainState, ResumeIsExactInBf16Mixed) { expect_exact_resume({true, false}); }

TEST(TrainState, TrainableNamesAreUniqueAndMatchTheTensors) {
  Trainee t({}, 1);
  const auto& names = t.parts->trainable_names();
  ASSERT_EQ(names.size(), t.parts->trainable().size());
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
  EXPECT_EQ(names.back(), "distill_heads.feature_0_1.bias");
  EXPECT_NE(std::find(names.begin(), names.end(), "distill_heads.in_proj.weight"), names.end());
}

TEST(TrainState, SaveBeforeTheFirstStepHasNoOptimizerState) {
  test::TempDir tmp("wd-train-state");
  Trainee source({}, 1);
  save_train_state(tmp.str(), *source.parts, *source.optimizer, TrainCursor{0}, "", false);
  EXPECT_FALSE(fs::exists(tmp.str("student")));
  Trainee target({}, 2);
  EXPECT_EQ(load_train_state(tmp.str(), *target.parts, *target.optimizer).step, 0);
  EXPECT_TRUE(target.optimizer->state().empty());
  for (std::size_t i = 0; i < source.parts->trainable().size(); ++i) {
    EXPECT_TRUE(torch::equal(source.parts->trainable()[i], target.parts->trainable()[i]));
  }
}

/// Saves a checkpoint of `saved` options and loads it into parts of `loaded` options.
DataError load_error(const Options& saved, const Options& loaded) {
  test::TempDir tmp("wd-train-state");
  Trainee source(saved, 1);
  torch::manual_seed(2);
  source.step(0);
  save_train_state(tmp.str(), *source.parts, *source.optimizer, TrainCursor{1}, "", false);
  Trainee target(loaded, 3);
  const auto before = target.parts->trainable().front().clone();
  try {
    load_train_state(tmp.str(), *target.parts, *target.optimizer);
  } catch (const DataError& e) {
    EXPECT_TRUE(torch::equal(before, target.parts->trainable().front())) << "a refused load changed the parts";
    EXPECT_TRUE(target.optimizer->state().empty());
    return e;
  }
  ADD_FAILURE() << "load_train_state accepted a mismatching checkpoint";
  return DataError("", "", "");
}

TEST(TrainState, OtherStudentDimsAreRefusedNamingTheTensor) {
  Options wider;
  wider.dim = 48;
  const auto e = load_error({}, wider);
  EXPECT_TRUE(test::contains(e.file(), "trainable.safetensors")) << e.what();
  EXPECT_FALSE(e.item().empty());
  EXPECT_TRUE(test::contains(e.what(), "shape mismatch: expected [")) << e.what();
  EXPECT_TRUE(test::contains(e.what(), "48")) << e.what();
}

TEST(TrainState, OtherFeatureHeadsAreRefusedNamingTheTensor) {
  Options other;
  other.features = {{1, 1}};
  const auto e = load_error({}, other);
  EXPECT_EQ(e.item(), "distill_heads.feature_1_1.weight");
  EXPECT_TRUE(test::contains(e.what(), "missing")) << e.what();
}

TEST(TrainState, AmsgradWithoutSavedMaximaIsRefused) {
  Options ams;
  ams.amsgrad = true;
  const auto e = load_error({}, ams);
  EXPECT_TRUE(test::contains(e.file(), "optimizer.safetensors")) << e.what();
  EXPECT_EQ(e.item(), "__metadata__.amsgrad");
}

}  // namespace
}  // namespace wd::student
