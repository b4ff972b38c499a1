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
#include "student/ema.hpp"
#include "student/train_state.hpp"
#include "student/train_step.hpp"
#include "student_batches.hpp"
#include "test_util.hpp"

namespace wd::student::test_train_state {
namespace {

namespace fs = std::filesystem;

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
    // 6 and 2 channels against the teacher's 4: the projections are trained too.
    parts = std::make_unique<StudentParts>(
        WanDiT(testing::small_student(6, 2, o.dim), WanInit::kRandom, torch::kFloat, init_seed), s);
    optimizer = std::make_unique<TrainOptimizer>(
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
    const auto it = optimizer->adamw().state().find(compat::optimizer_state_key(parts->trainable()[i]));
    EXPECT_NE(it, optimizer->adamw().state().end()) << parts->trainable_names()[i];
    return static_cast<const torch::optim::AdamWParamState&>(*it->second);
  }

  std::unique_ptr<StudentParts> parts;
  std::unique_ptr<TrainOptimizer> optimizer;
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
      save_train_state(dir, *first.parts, first.optimizer->adamw(), TrainCursor{kHalf}, "[train]\nsteps = 6\n");
    });
  }
  // As a new process would be: other initial weights, the generator elsewhere.
  Trainee resumed(o, 99);
  torch::randn({17});
  ASSERT_EQ(store.latest_good()->path, saved);
  const auto cursor = load_train_state(saved, *resumed.parts, resumed.optimizer->adamw());
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
  save_train_state(tmp.str(), *source.parts, source.optimizer->adamw(), TrainCursor{0}, "", false);
  EXPECT_FALSE(fs::exists(tmp.str("student")));
  Trainee target({}, 2);
  EXPECT_EQ(load_train_state(tmp.str(), *target.parts, target.optimizer->adamw()).step, 0);
  EXPECT_TRUE(target.optimizer->adamw().state().empty());
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
  save_train_state(tmp.str(), *source.parts, source.optimizer->adamw(), TrainCursor{1}, "", false);
  Trainee target(loaded, 3);
  const auto before = target.parts->trainable().front().clone();
  try {
    load_train_state(tmp.str(), *target.parts, target.optimizer->adamw());
  } catch (const DataError& e) {
    EXPECT_TRUE(torch::equal(before, target.parts->trainable().front())) << "a refused load changed the parts";
    EXPECT_TRUE(target.optimizer->adamw().state().empty());
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


// train.ema_decay: the average follows d·ema + (1 − d)·w with the warm-up decay, saves and
// restores exactly (a resumed average equals the straight one bit for bit), lends its weights
// to the parts (and their bf16 copy) only while asked, and a checkpoint without an average
// starts it from the restored weights.
TEST(Ema, AveragesTheStepsResumesExactlyAndLendsItsWeights) {
  Options o;
  o.mixed = true;
  Trainee straight(o, 7);
  EmaWeights ema(*straight.parts, 0.8);
  EXPECT_DOUBLE_EQ(ema.decay_at(1), 2.0 / 11.0);  // warm-up: (1 + s) / (10 + s)
  EXPECT_DOUBLE_EQ(ema.decay_at(100), 0.8);
  std::vector<torch::Tensor> expected;
  for (const auto& w : straight.parts->trainable()) expected.push_back(w.detach().to(torch::kDouble).clone());
  test::TempDir tmp("wd-ema");
  torch::manual_seed(11);
  for (std::int64_t s = 0; s < 6; ++s) {
    straight.step(s);
    ema.update(*straight.parts, s + 1);
    const double d = ema.decay_at(s + 1);
    for (std::size_t i = 0; i < expected.size(); ++i) {
      expected[i] = d * expected[i] + (1 - d) * straight.parts->trainable()[i].detach().to(torch::kDouble);
    }
    if (s + 1 == 3) {  // save_train_state keeps the generator: the resumed steps see the same noise
      save_train_state(tmp.str(), *straight.parts, straight.optimizer->adamw(), TrainCursor{3}, "", false);
      ema.save(tmp.str(), *straight.parts);
    }
  }
  const auto& names = straight.parts->trainable_names();
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::allclose(ema.tensors()[i].to(torch::kDouble), expected[i], 1e-6, 1e-7)) << names[i];
  }

  // Resumed from step 3 as a new process would be: the same average at step 6, bit for bit.
  Trainee resumed(o, 99);
  EmaWeights again(*resumed.parts, 0.8);
  ASSERT_EQ(load_train_state(tmp.str(), *resumed.parts, resumed.optimizer->adamw()).step, 3);
  again.restore(tmp.str(), *resumed.parts);
  for (std::int64_t s = 3; s < 6; ++s) {
    resumed.step(s);
    again.update(*resumed.parts, s + 1);
  }
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(torch::equal(again.tensors()[i], ema.tensors()[i])) << names[i];

  // Lent while asked: the parts predict with the average (bf16 copy refreshed), then exactly as before.
  const auto b = batch(2, 5);
  std::vector<torch::Tensor> trained;
  for (const auto& w : straight.parts->trainable()) trained.push_back(w.detach().clone());
  const auto before = straight.parts->predict(b);
  torch::Tensor during;
  ema.with_averaged(*straight.parts, [&] {
    for (std::size_t i = 0; i < trained.size(); ++i) EXPECT_TRUE(torch::equal(straight.parts->trainable()[i], ema.tensors()[i]));
    during = straight.parts->predict(b);
  });
  EXPECT_GT((during - before).abs().max().item<float>(), 0.f);
  for (std::size_t i = 0; i < trained.size(); ++i) EXPECT_TRUE(torch::equal(straight.parts->trainable()[i], trained[i])) << names[i];
  EXPECT_TRUE(torch::equal(straight.parts->predict(b), before));

  // A checkpoint without ema.safetensors: the average starts from the restored weights.
  fs::remove(fs::path(tmp.str()) / EmaWeights::kFile);
  Trainee plain(o, 5);
  EmaWeights fresh(*plain.parts, 0.8);
  load_train_state(tmp.str(), *plain.parts, plain.optimizer->adamw());
  fresh.restore(tmp.str(), *plain.parts);
  for (std::size_t i = 0; i < names.size(); ++i) EXPECT_TRUE(torch::equal(fresh.tensors()[i], plain.parts->trainable()[i])) << names[i];
}

TEST(Ema, AnAverageOfAnotherStudentIsRefusedNamingTheTensor) {
  Trainee a(Options{}, 1);
  EmaWeights ema(*a.parts, 0.9);
  test::TempDir tmp("wd-ema-other");
  ema.save(tmp.str(), *a.parts);
  Options wider;
  wider.dim = 40;
  Trainee b(wider, 1);
  EmaWeights other(*b.parts, 0.9);
  try {
    other.restore(tmp.str(), *b.parts);
    FAIL() << "an average of another shape was taken";
  } catch (const DataError& e) {
    EXPECT_TRUE(test::contains(e.file(), "ema.safetensors")) << e.what();
    EXPECT_TRUE(test::contains(e.what(), "shape")) << e.what();
  }
  EXPECT_THROW(EmaWeights(*a.parts, 1.0), ConfigError);
}

}  // namespace
}  // namespace wd::student::test_train_state
