// train.trajectory_rollout: the batched roll-out against a per-sample recomputation.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include "core/errors.hpp"
#include "data/flow_sampler.hpp"
#include "student/trajectory_rollout.hpp"
#include "student_batches.hpp"
#include "test_util.hpp"

namespace wd::student::test_trajectory_rollout {
namespace {

struct Fixture {
  Fixture() {
    const auto c = testing::small_student();
    PartsSetup s;
    s.teacher_in_channels = c.in_dim;
    s.teacher_out_channels = c.out_dim;
    s.teacher_dim = 24;
    s.seed = 3;
    parts = std::make_unique<StudentParts>(WanDiT(c, WanInit::kRandom, torch::kFloat, 3), s);
    channels = c.in_dim;
  }
  std::unique_ptr<StudentParts> parts;
  std::int64_t channels = 0;
};

/// Six samples at intervals 0, 1, 2, 3, 2, 1 of the 4-step shift-3 grid.
comm::TensorDict trajectory_batch(const std::vector<double>& sigmas, std::int64_t channels) {
  auto g = at::detail::createCPUGenerator(11);
  const std::vector<std::int64_t> intervals{0, 1, 2, 3, 2, 1};
  std::vector<float> t;
  for (const auto i : intervals) t.push_back(static_cast<float>(1000.0 * sigmas[static_cast<std::size_t>(i)]));
  const auto B = static_cast<std::int64_t>(intervals.size());
  return {{"x_t", torch::randn({B, channels, 2, 4, 4}, g)},
          {"x_start", torch::randn({B, channels, 2, 4, 4}, g)},
          {"t", torch::tensor(t)},
          {"context", torch::randn({B, 5, 8}, g)},
          {"context_lens", torch::tensor(std::vector<std::int64_t>{5, 4, 5, 3, 5, 2})},
          {"teacher_out", torch::randn({B, channels, 2, 4, 4}, g)}};
}

TEST(TrajectoryRollout, TheChosenSamplesStartFromTheStudentsOwnJumpsAndAimAtTheTeachersNextState) {
  Fixture f;
  const auto sigmas = data::sampling_sigmas(4, 3.0);
  const auto b = trajectory_batch(sigmas, f.channels);
  const std::vector<std::int64_t> intervals{0, 1, 2, 3, 2, 1};
  // 0.6 of 6 = the first 4 places; place 0 is at interval 0 (its input is the noise already).
  const auto out = roll_out(*f.parts, b, sigmas, 0.6);
  for (std::int64_t s = 0; s < 6; ++s) {
    const auto i = intervals[static_cast<std::size_t>(s)];
    if (s == 0 || s >= 4) {  // not rolled out: bit-identical
      EXPECT_TRUE(torch::equal(out.at("x_t")[s], b.at("x_t")[s])) << s;
      EXPECT_TRUE(torch::equal(out.at("teacher_out")[s], b.at("teacher_out")[s])) << s;
      continue;
    }
    // The recomputation: this sample alone, i Euler jumps of the student from its noise.
    auto y = b.at("x_start").slice(0, s, s + 1).clone();
    for (std::int64_t j = 0; j < i; ++j) {
      const auto sj = sigmas[static_cast<std::size_t>(j)], sn = sigmas[static_cast<std::size_t>(j + 1)];
      const comm::TensorDict one{{"x_t", y},
                                 {"t", torch::full({1}, static_cast<float>(1000.0 * sj))},
                                 {"context", b.at("context").slice(0, s, s + 1)},
                                 {"context_lens", b.at("context_lens").slice(0, s, s + 1)}};
      y = y + (sn - sj) * f.parts->predict(one);
    }
    const auto gap = sigmas[static_cast<std::size_t>(i + 1)] - sigmas[static_cast<std::size_t>(i)];
    const auto next = b.at("x_t")[s] + gap * b.at("teacher_out")[s];
    EXPECT_TRUE(torch::allclose(out.at("x_t")[s], y[0], 1e-5, 1e-5)) << s;
    EXPECT_TRUE(torch::allclose(out.at("teacher_out")[s], (next - y[0]) / gap, 1e-4, 1e-4)) << s;
    // The new input and target still land on the teacher's next state.
    EXPECT_TRUE(torch::allclose(out.at("x_t")[s] + gap * out.at("teacher_out")[s], next, 1e-5, 1e-5)) << s;
    EXPECT_FALSE(torch::allclose(out.at("x_t")[s], b.at("x_t")[s])) << s;
  }
  for (const auto* name : {"t", "context", "context_lens", "x_start"}) {
    EXPECT_TRUE(torch::equal(out.at(name), b.at(name))) << name;
  }
  // The input batch is not changed in place.
  const auto again = trajectory_batch(sigmas, f.channels);
  EXPECT_TRUE(torch::equal(b.at("x_t"), again.at("x_t")));
  EXPECT_TRUE(torch::equal(b.at("teacher_out"), again.at("teacher_out")));
}

TEST(TrajectoryRollout, NothingChosenIsThePlainBatchAndAMissingNoiseIsNamed) {
  Fixture f;
  const auto sigmas = data::sampling_sigmas(4, 3.0);
  auto b = trajectory_batch(sigmas, f.channels);
  const auto out = roll_out(*f.parts, b, sigmas, 0.05);  // round(0.3) = 0 samples
  EXPECT_TRUE(torch::equal(out.at("x_t"), b.at("x_t")));
  EXPECT_TRUE(torch::equal(out.at("teacher_out"), b.at("teacher_out")));
  b.erase("x_start");
  try {
    roll_out(*f.parts, b, sigmas, 1.0);
    FAIL() << "rolled out without the noise";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "x_start")) << e.what();
  }
}

}  // namespace
}  // namespace wd::student::test_trajectory_rollout
