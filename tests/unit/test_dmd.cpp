// train.objective dmd's schedule of requests and answers (comm::ServiceSchedule), and the
// seeding of the generator's samples and re-noising (student/dmd.hpp). The maths is checked
// against PyTorch in tests/python/test_dmd_reference.py, the channel in tests/launch.
#include <gtest/gtest.h>

#include "comm/score_channel.hpp"
#include "data/flow_sampler.hpp"
#include "student/dmd.hpp"
#include "student_batches.hpp"

namespace wd::student::test_dmd {
namespace {

comm::ServiceSchedule schedule(std::int64_t ratio, std::int64_t lead, std::int64_t first, std::int64_t steps) {
  comm::ServiceSchedule s;
  s.ratio = ratio;
  s.lead = lead;
  s.first_step = first;
  s.train_steps = steps;
  return s;
}

TEST(ServiceSchedule, AsksAtEachCycleStartAndAnswersBeforeItsLastStep) {
  const auto s = schedule(5, 2, 0, 12);
  EXPECT_EQ(s.first_cycle(), 0);
  EXPECT_EQ(s.end_cycle(), 2);  // steps 10-11 have no generator update: no request
  std::vector<std::int64_t> asks, updates;
  for (std::int64_t step = 0; step < 12; ++step) {
    if (s.asks_at(step)) asks.push_back(step);
    if (s.generator_step(step)) updates.push_back(step);
  }
  EXPECT_EQ(asks, (std::vector<std::int64_t>{0, 5}));
  EXPECT_EQ(updates, (std::vector<std::int64_t>{4, 9}));
  EXPECT_EQ(s.answer_after(0), 2);  // two stream steps of lead
  EXPECT_EQ(s.answer_after(1), 7);
  // A lead past the cycle answers after its last batch, before its update needs the answer.
  EXPECT_EQ(schedule(3, 5, 0, 9).answer_after(1), 5);
}

TEST(ServiceSchedule, AResumeInsideACycleAsksAgainAtItsFirstStep) {
  const auto s = schedule(5, 2, 7, 15);
  EXPECT_EQ(s.first_cycle(), 1);
  EXPECT_EQ(s.request_step(1), 7);
  EXPECT_TRUE(s.asks_at(7));
  EXPECT_FALSE(s.asks_at(5));
  EXPECT_EQ(s.answer_after(1), 9);
  EXPECT_TRUE(s.asks_at(10));
}

TEST(ServiceSchedule, EveryAnswerFallsBetweenItsRequestAndItsUpdate) {
  for (std::int64_t ratio = 1; ratio <= 6; ++ratio) {
    for (std::int64_t lead = 1; lead <= 3; ++lead) {
      for (std::int64_t first = 0; first < 2 * ratio; ++first) {
        const auto s = schedule(ratio, lead, first, 4 * ratio);
        for (auto c = s.first_cycle(); c < s.end_cycle(); ++c) {
          EXPECT_GE(s.answer_after(c), s.request_step(c)) << ratio << " " << lead << " " << first << " " << c;
          EXPECT_LE(s.answer_after(c), c * ratio + ratio - 1) << ratio << " " << lead << " " << first << " " << c;
          EXPECT_TRUE(s.asks_at(s.request_step(c)));
        }
      }
    }
  }
}

DmdSpec spec() {
  DmdSpec s;
  s.sigmas = data::sampling_sigmas(2, 3.0);
  s.shift = 3.0;
  s.seed = 7;
  s.latent = {4, 2, 4, 4};
  return s;
}

TEST(Dmd, SamplesAndReNoisingArePureFunctionsOfTheirKeys) {
  const auto c = testing::small_student();
  PartsSetup setup;
  setup.teacher_in_channels = c.in_dim;
  setup.teacher_out_channels = c.out_dim;
  setup.seed = 3;
  StudentParts generator(WanDiT(c, WanInit::kRandom, torch::kFloat, 3), setup);
  comm::TensorDict in{{"context", torch::randn({2, 5, 8})}, {"context_lens", torch::tensor({5, 2}, torch::kLong)}};
  const auto policy = CheckpointPolicy::parse("off");
  const auto a = generate(generator, in, spec(), 3, false, policy);
  EXPECT_TRUE(torch::equal(a, generate(generator, in, spec(), 3, false, policy)));
  EXPECT_FALSE(torch::equal(a, generate(generator, in, spec(), 4, false, policy)));
  auto other = spec();
  other.student = 1;  // each student its own noise
  EXPECT_FALSE(torch::equal(a, generate(generator, in, other, 3, false, policy)));
  // With a graph the values are the same (what the generator update relies on).
  EXPECT_TRUE(torch::equal(a, generate(generator, in, spec(), 3, true, policy).detach()));
  const auto r = renoise(a, spec(), 5, 11);
  EXPECT_TRUE(torch::equal(r.x, renoise(a, spec(), 5, 11).x));
  EXPECT_FALSE(torch::equal(r.x, renoise(a, spec(), 5, 12).x));
  const auto sigma = r.sigma.flatten();
  const double lo = 3.0 * 0.02 / (1 + 2.0 * 0.02), hi = 3.0 * 0.98 / (1 + 2.0 * 0.98);
  EXPECT_TRUE((sigma >= lo - 1e-6).all().item<bool>() && (sigma <= hi + 1e-6).all().item<bool>()) << sigma;
  EXPECT_TRUE(torch::allclose(r.t, sigma * 1000.0, 1e-5, 1e-3));
}

TEST(Dmd, TheGradientIsNormalisedPerSampleAndFiniteWhereTheTeacherAgrees) {
  const auto x0 = torch::ones({2, 1, 1, 1, 2});
  auto real = torch::zeros({2, 1, 1, 1, 2});
  real[1].fill_(1.0);  // sample 1: the teacher's x0 is the sample itself (normaliser 0)
  const auto fake = torch::full({2, 1, 1, 1, 2}, 0.5);
  const auto g = dmd_gradient(x0, real, fake);
  EXPECT_TRUE(torch::allclose(g[0], torch::full({1, 1, 1, 2}, 0.5)));  // (0.5 − 0) / mean|1 − 0|
  EXPECT_TRUE(torch::isfinite(g).all().item<bool>());
  EXPECT_TRUE(torch::equal(g[1], torch::zeros({1, 1, 1, 2})));  // −0.5 / 0 = −inf → 0
}

}  // namespace
}  // namespace wd::student::test_dmd
