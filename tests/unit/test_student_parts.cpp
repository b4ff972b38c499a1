// StudentParts: gradient accumulation, channel projections, feature heads, mixed precision,
// and that nothing is created after start-up.
#include <gtest/gtest.h>

#include "core/errors.hpp"
#include "student/distill_objective.hpp"
#include "student/student_parts.hpp"
#include "student/train_step.hpp"
#include "student_batches.hpp"

namespace wd::student::test_student_parts {
namespace {

using testing::batch;
using testing::slice;

PartsSetup setup() {
  PartsSetup s;
  s.teacher_in_channels = 4;
  s.teacher_out_channels = 4;
  s.teacher_dim = 24;
  return s;
}

double max_grad_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, (a[i].grad() - b[i].grad()).abs().max().item<double>());
  }
  return d;
}

const CheckpointPolicy kOff = CheckpointPolicy::parse("off");

TEST(StudentParts, GradAccumulationEqualsOneStepOverTheConcatenatedBatch) {
  auto s = setup();
  s.feature_pairs = {{0, 1}};
  s.feature_weight = 0.5;
  StudentParts accum(WanDiT(testing::small_student(), WanInit::kRandom, torch::kFloat, 3), s);
  StudentParts whole(WanDiT(testing::small_student(), WanInit::kRandom, torch::kFloat, 3), s);
  // Same start: the feature head is random too, so copy it over.
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < accum.trainable().size(); ++i) whole.trainable()[i].copy_(accum.trainable()[i]);
  }
  const auto b = batch(4, 11);
  accum.zero_grad();
  const auto l1 = accum.micro_step(slice(b, 0, 2), 0.5, kOff).read();
  const auto l2 = accum.micro_step(slice(b, 2, 4), 0.5, kOff).read();
  whole.zero_grad();
  const auto l = whole.micro_step(b, 1.0, kOff).read();
  EXPECT_NEAR(0.5 * (l1.total + l2.total), l.total, 1e-6);
  EXPECT_LE(max_grad_diff(accum.trainable(), whole.trainable()), 1e-6);
}

TEST(StudentParts, ProjectionsAppearWhenChannelsDifferAndAreNotZero) {
  auto s = setup();
  StudentParts trained(WanDiT(testing::small_student(6, 2), WanInit::kRandom, torch::kFloat, 1), s);
  const auto n_model = trained.model()->parameters().size();
  EXPECT_EQ(trained.trainable().size(), n_model + 4);  // in_proj and out_proj weight + bias
  // in_proj [6,4]: orthonormal columns; out_proj [4,2]: orthonormal columns. Never zeros.
  const auto& in_w = trained.trainable()[n_model];
  EXPECT_EQ(in_w.sizes(), (std::vector<std::int64_t>{6, 4}));
  EXPECT_LE((in_w.t().matmul(in_w) - torch::eye(4)).abs().max().item<float>(), 1e-5);
  trained.zero_grad();
  trained.micro_step(batch(2, 5), 1.0, kOff);
  EXPECT_GT(in_w.grad().abs().sum().item<float>(), 0.f);

  s.train_projections = false;
  StudentParts frozen(WanDiT(testing::small_student(6, 2), WanInit::kRandom, torch::kFloat, 1), s);
  EXPECT_EQ(frozen.trainable().size(), n_model);
  EXPECT_EQ(frozen.predict(batch(2, 5)).sizes(), (std::vector<std::int64_t>{2, 4, 2, 4, 4}));
}

TEST(StudentParts, NothingIsCreatedAfterStepZero) {
  auto s = setup();
  s.feature_pairs = {{1, 1}};
  s.feature_weight = 1.0;
  s.mixed_bf16 = true;
  StudentParts parts(WanDiT(testing::small_student(6, 2), WanInit::kRandom, torch::kFloat, 2), s);
  TrainOptimizer opt(parts.trainable(), torch::optim::AdamWOptions(1e-3));
  const auto modules = parts.module_count();
  const auto params = parts.parameter_count();
  std::vector<void*> ptrs;
  for (const auto& p : parts.trainable()) ptrs.push_back(p.data_ptr());
  for (int step = 0; step < 4; ++step) {
    DistillObjective objective(parts, CheckpointPolicy::parse(step % 2 ? "all" : "off"));
    StepContext context{objective, opt};
    FixedBatches micro({batch(2, 100 + step)});
    train_step(context, step, 1e-3, micro);
    EXPECT_EQ(parts.module_count(), modules) << "step " << step;
    EXPECT_EQ(parts.parameter_count(), params) << "step " << step;
    for (std::size_t i = 0; i < ptrs.size(); ++i) ASSERT_EQ(parts.trainable()[i].data_ptr(), ptrs[i]);
  }
}

TEST(StudentParts, MixedPrecisionKeepsFp32MastersAndFollowsFp32Gradients) {
  auto s = setup();
  StudentParts fp32(WanDiT(testing::small_student(), WanInit::kRandom, torch::kFloat, 4), s);
  s.mixed_bf16 = true;
  StudentParts mixed(WanDiT(testing::small_student(), WanInit::kRandom, torch::kFloat, 4), s);
  const auto b = batch(2, 9);
  fp32.zero_grad();
  mixed.zero_grad();
  const auto lf = fp32.micro_step(b, 1.0, kOff).read();
  const auto lm = mixed.micro_step(b, 1.0, kOff).read();
  EXPECT_NEAR(lm.total, lf.total, 2e-2 * lf.total);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < fp32.trainable().size(); ++i) {
    const auto& m = mixed.trainable()[i];
    ASSERT_EQ(m.scalar_type(), torch::kFloat);
    ASSERT_EQ(m.grad().scalar_type(), torch::kFloat);
    num += (m.grad() - fp32.trainable()[i].grad()).pow(2).sum().item<double>();
    den += fp32.trainable()[i].grad().pow(2).sum().item<double>();
  }
  EXPECT_LT(std::sqrt(num / den), 5e-2);  // bf16 compute, fp32 accumulation
  torch::optim::AdamW opt(mixed.trainable(), torch::optim::AdamWOptions(1e-2));
  opt.step();
  mixed.after_optimizer_step();
  // The bf16 copy follows the masters: predictions move with them.
  EXPECT_GT((mixed.predict(b) - fp32.predict(b)).abs().max().item<float>(), 0.f);
}

TEST(StudentParts, FeatureHeadsLearnFromTheTeachersHiddenStates) {
  auto s = setup();
  s.feature_pairs = {{0, 1}};
  s.feature_weight = 1.0;
  StudentParts parts(WanDiT(testing::small_student(), WanInit::kRandom, torch::kFloat, 6), s);
  parts.zero_grad();
  const auto l = parts.micro_step(batch(2, 7), 1.0, kOff).read();
  EXPECT_GT(l.features, 0.0);
  EXPECT_NEAR(l.total, l.output + l.features, 1e-5);
  EXPECT_GT(parts.trainable().back().grad().abs().sum().item<float>(), 0.f);
  s.feature_pairs = {{5, 1}};  // the student has blocks 0..1
  EXPECT_THROW(StudentParts(WanDiT(testing::small_student(), WanInit::kRandom, torch::kFloat, 6), s), ConfigError);
}

}  // namespace
}  // namespace wd::student::test_student_parts
