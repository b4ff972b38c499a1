// probe_sampling: a student with a zeroed output head is flagged in every channel, a probe is
// deterministic and leaves the training RNG alone.
#include <gtest/gtest.h>

#include "student/sample_probe.hpp"
#include "student_batches.hpp"

namespace wd::student::test_sample_probe {
namespace {

StudentParts make_parts() {
  PartsSetup s;
  s.teacher_in_channels = 4;
  s.teacher_out_channels = 4;
  s.teacher_dim = 24;
  return StudentParts(WanDiT(testing::small_student(), WanInit::kRandom, torch::kFloat, 3), s);
}

TrainConfig probe_config() {
  TrainConfig t;
  t.sample_steps = 6;
  return t;
}

TEST(SampleProbe, ZeroHeadIsFlaggedInEveryChannel) {
  auto parts = make_parts();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : parts.model()->named_parameters()) {
      if (p.key().rfind("head.head.", 0) == 0) p.value().zero_();
    }
  }
  const auto probe = probe_sampling(parts, testing::batch(2, 7), probe_config());
  EXPECT_TRUE(probe.collapsed());
  EXPECT_EQ(probe.static_channels, (std::vector<std::int64_t>{0, 1, 2, 3}));
  EXPECT_LT(probe.moved_ratio, 1e-6);  // UniPC's fp32 coefficients on x0 = x: rounding only
  // The noise itself stays: its std is that of a normal, not flat.
  EXPECT_TRUE(probe.flat_channels.empty());
}

TEST(SampleProbe, DeterministicAndTheTrainingRngIsUntouched) {
  auto parts = make_parts();
  const auto b = testing::batch(2, 7);
  torch::manual_seed(5);
  const auto expected = torch::randn({4});
  torch::manual_seed(5);
  const auto first = probe_sampling(parts, b, probe_config());
  EXPECT_TRUE(torch::equal(torch::randn({4}), expected));
  const auto second = probe_sampling(parts, b, probe_config());
  EXPECT_EQ(first.final_ratio, second.final_ratio);
  EXPECT_EQ(first.moved_ratio, second.moved_ratio);
  EXPECT_GT(first.moved_ratio, 0.0);
}

}  // namespace
}  // namespace wd::student::test_sample_probe
