// train.objective dmd's schedule of requests and answers (comm::ServiceSchedule), and the
// seeding of the generator's samples and re-noising (student/dmd.hpp). The maths is checked
// against PyTorch in tests/python/test_dmd_reference.py, the channel in tests/launch.
#include <gtest/gtest.h>

#include "comm/score_channel.hpp"
#include "core/errors.hpp"
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

TEST(Dmd, AWeightedGradientLeavesTheCleanFrameOutOfTheStepAndTheNormaliser) {
  auto gen = at::detail::createCPUGenerator(2);
  const auto x0 = torch::randn({2, 3, 2, 2, 2}, gen);
  const auto real = torch::randn({2, 3, 2, 2, 2}, gen);
  const auto fake = torch::randn({2, 3, 2, 2, 2}, gen);
  auto w = torch::ones({2, 1, 2, 1, 1});
  w[0][0][0] = 0;  // sample 0's first frame is its clean image
  const auto g = dmd_gradient(x0, real, fake, w);
  EXPECT_TRUE(torch::equal(g[0].select(1, 0), torch::zeros({3, 2, 2})));
  // Sample 0's later frame: normalised by the mean over that frame alone.
  const auto later = [](const torch::Tensor& t) { return t[0].select(1, 1); };
  const auto expected = (later(fake) - later(real)) / (later(x0) - later(real)).abs().mean();
  EXPECT_TRUE(torch::allclose(later(g), expected, 1e-6, 1e-6));
  // Sample 1 has no clean frame: as without weights.
  EXPECT_TRUE(torch::allclose(g[1], dmd_gradient(x0, real, fake)[1], 1e-6, 1e-6));
}

/// A ti2v student (per-token t) and a batch of 2 whose first sample is conditioned: its first
/// latent frame (4 tokens on the 1x2x2 patch grid) is its image, at t = 0.
struct Ti2vBatch {
  StudentParts model;
  comm::TensorDict batch;

  static Ti2vBatch make() {
    auto c = testing::small_student();
    c.model_type = "ti2v";
    PartsSetup setup;
    setup.teacher_in_channels = c.in_dim;
    setup.teacher_out_channels = c.out_dim;
    setup.seed = 3;
    auto batch = testing::batch(2, 9);
    auto t = torch::full({2, 8}, 700.0f);
    t[0].narrow(0, 0, 4).zero_();
    batch["t"] = t;
    return {StudentParts(WanDiT(c, WanInit::kRandom, torch::kFloat, 3), setup), batch};
  }
  torch::Tensor image() const { return batch.at("x_t")[0].select(1, 0); }
};

TEST(Dmd, ATi2vImageStaysTheFirstFrameOfTheGeneratorsSamplesAndTheirReNoising) {
  auto f = Ti2vBatch::make();
  const auto policy = CheckpointPolicy::parse("off");
  for (const bool simulate : {true, false}) {
    auto s = spec();
    s.simulate = simulate;
    const auto x0 = generate(f.model, f.batch, s, 3, false, policy);
    EXPECT_TRUE(torch::equal(x0[0].select(1, 0), f.image())) << simulate;
    EXPECT_FALSE(torch::equal(x0[1].select(1, 0), f.batch.at("x_t")[1].select(1, 0))) << simulate;
    const CleanFrames clean(f.model, f.batch);
    const auto r = renoise(x0, s, 5, 11, clean);
    EXPECT_TRUE(torch::equal(r.x[0].select(1, 0), f.image()));
    // Per-token t as the batch's: the image's tokens at 0, the rest at the sample's σ.
    ASSERT_EQ(r.t.sizes(), (std::vector<std::int64_t>{2, 8}));
    EXPECT_TRUE(torch::equal(r.t[0].narrow(0, 0, 4), torch::zeros({4})));
    const auto t0 = r.sigma.flatten()[0].item<float>() * 1000.0f;
    EXPECT_NEAR(r.t[0][4].item<float>(), t0, 1e-2);
    EXPECT_TRUE(torch::equal(r.t[1], torch::full({8}, r.t[1][0].item<float>())));
    // The rest re-noises as an unconditioned sample would.
    const auto plain = renoise(x0, s, 5, 11);
    EXPECT_TRUE(torch::equal(r.x[1], plain.x[1]));
    EXPECT_TRUE(torch::equal(r.x[0].select(1, 1), plain.x[0].select(1, 1)));
  }
  // The last jump's graph reaches the generated frame, not the image.
  const auto x0 = generate(f.model, f.batch, spec(), 3, true, policy);
  const auto& params = f.model.trainable();
  const auto norm = [&](const torch::Tensor& y) {
    double n = 0;
    for (const auto& g : torch::autograd::grad({y.sum()}, params, {}, true, false, true)) {
      if (g.defined()) n += g.abs().sum().item<double>();
    }
    return n;
  };
  EXPECT_EQ(norm(x0[0].select(1, 0)), 0.0);
  EXPECT_GT(norm(x0[0].select(1, 1)), 0.0);
}

TEST(Dmd, AnI2vConditionGoesWithEveryJumpOfTheGenerator) {
  // i2v: in_dim = 4 noisy + 4 mask + 4 image latent channels.
  auto c = testing::small_student(12, 4);
  c.model_type = "i2v";
  PartsSetup setup;
  setup.teacher_in_channels = c.in_dim;
  setup.teacher_out_channels = c.out_dim;
  setup.seed = 3;
  StudentParts generator(WanDiT(c, WanInit::kRandom, torch::kFloat, 3), setup);
  auto gen = at::detail::createCPUGenerator(4);
  comm::TensorDict in{{"context", torch::randn({2, 5, 8}, gen)},
                      {"context_lens", torch::tensor({5, 2}, torch::kLong)},
                      {"y", torch::randn({2, 8, 2, 4, 4}, gen)}};
  const auto policy = CheckpointPolicy::parse("off");
  const auto a = generate(generator, in, spec(), 3, false, policy);
  EXPECT_TRUE(torch::equal(a, generate(generator, in, spec(), 3, false, policy)));
  auto other = in;
  other["y"] = torch::randn({2, 8, 2, 4, 4}, gen);
  EXPECT_FALSE(torch::allclose(a, generate(generator, other, spec(), 3, false, policy)));
  in.erase("y");
  EXPECT_THROW(generate(generator, in, spec(), 3, false, policy), Error);
}

}  // namespace
}  // namespace wd::student::test_dmd
