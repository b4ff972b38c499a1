// train.objective flow's targets: each message's target is the velocity of its own noising path,
// recomputed here from the definition (x_t = (1 − σ)·x0 + σ·ε, target ε − x0) with x0 read back
// from the file; contexts are dropped at the configured rate, never for held-out samples, and
// the same on every construction.
#include <gtest/gtest.h>

#include "comm/stream_plan.hpp"
#include "data/dataset_info.hpp"
#include "data/dataset_reader.hpp"
#include "data/synthetic_dataset.hpp"
#include "teacher/flow_targets.hpp"
#include "teacher/target_source.hpp"
#include "test_util.hpp"

namespace wd::test_flow_targets {
namespace {

struct Fixture {
  test::TempDir dir{"flow-targets"};
  data::DatasetInfo info;
  comm::StreamPlan plan;
  data::NoiseConfig noise;

  Fixture() {
    data::SyntheticDatasetSpec spec;
    spec.output = dir.str("data.h5");
    spec.samples = 24;
    spec.latent = {4, 1, 8, 8};
    spec.text_len = 6;
    spec.text_dim = 8;
    spec.seed = 3;
    data::write_synthetic_dataset(spec);
    info = data::validate_dataset(spec.output, {});
    plan.batch_per_student = 2;
    plan.eval_messages = 1;
    plan.train_steps = 40;
    plan.micro_batches = 1;
    plan.latent = info.latent_shape;
    noise.sigma_min = 0.05;  // σ far from 0: the recomputation divides by it
  }
};

/// Every message of steps [0, steps) of FlowTargets over `fx` with dropout `p`, as the student
/// receives them (the local receiver).
std::vector<comm::TensorDict> messages(Fixture& fx, double p, std::int64_t steps) {
  data::DatasetReader reader(fx.info);
  const data::SampleSchedule schedule(20, 2, 1, 11);
  const data::FlowMatchingNoiser noiser(fx.noise, 11), eval_noiser(fx.noise, 12);
  teacher::FlowTargets targets({{reader, schedule, noiser, eval_noiser, 0, 1, 2, 20}, fx.plan, {1, 2, 2}, p, 11});
  teacher::LocalReceiver receiver("flow targets", targets, fx.plan, torch::kCPU, false);
  std::vector<comm::TensorDict> out;
  for (std::int64_t s = 0; s < steps; ++s) {
    comm::TensorDict copy;
    for (const auto& [name, t] : receiver.recv(s).tensors) copy[name] = t.clone();
    receiver.release(s);
    out.push_back(copy);
  }
  return out;
}

TEST(FlowTargets, EachTargetIsTheVelocityOfItsOwnNoisingPath) {
  Fixture fx;
  const auto got = messages(fx, 0.0, 6);
  data::DatasetReader reader(fx.info);
  const data::SampleSchedule schedule(20, 2, 1, 11);
  const data::FlowMatchingNoiser noiser(fx.noise, 11), eval_noiser(fx.noise, 12);
  const teacher::SampleStream samples{reader, schedule, noiser, eval_noiser, 0, 1, 2, 20};
  for (std::int64_t s = 0; s < 6; ++s) {
    const auto at = teacher::stream_position(fx.plan, s);
    const auto x0 = reader.read(samples.indices(at.position, at.eval)).latents;
    const auto& m = got[static_cast<std::size_t>(s)];
    const auto sigma = (m.at("t") / 1000.0).view({-1, 1, 1, 1, 1});
    // x_t = (1 − σ)·x0 + σ·ε  =>  ε = (x_t − (1 − σ)·x0) / σ, and the target is ε − x0.
    const auto eps = (m.at("x_t") - (1 - sigma) * x0) / sigma;
    EXPECT_TRUE(torch::allclose(m.at("teacher_out"), eps - x0, 1e-4, 1e-4)) << "step " << s;
    EXPECT_GT(m.at("teacher_out").abs().sum().item<double>(), 0);
  }
}

TEST(FlowTargets, ContextsAreDroppedAtTheRateAskedNeverHeldOutAndAlikeEveryTime) {
  Fixture fx;
  const auto a = messages(fx, 0.3, 41), b = messages(fx, 0.3, 41);
  const auto none = messages(fx, 0.0, 41);
  int dropped = 0, total = 0;
  for (std::size_t s = 0; s < a.size(); ++s) {
    for (const auto& [name, t] : a[s]) EXPECT_TRUE(torch::equal(t, b[s].at(name))) << name << " step " << s;
    const auto per_sample = a[s].at("context").abs().sum({1, 2});
    for (std::int64_t i = 0; i < per_sample.size(0); ++i) {
      const bool zero = per_sample[i].item<double>() == 0;
      if (s == 0) {
        EXPECT_FALSE(zero) << "a held-out sample's context was dropped";
        continue;
      }
      ++total;
      dropped += zero ? 1 : 0;
      // A kept context is the file's; everything but the context is as without dropout.
      if (!zero) {
        EXPECT_TRUE(torch::equal(a[s].at("context")[i], none[s].at("context")[i]));
      }
    }
    EXPECT_TRUE(torch::equal(a[s].at("teacher_out"), none[s].at("teacher_out")));
  }
  EXPECT_EQ(total, 80);
  EXPECT_GT(dropped, 12);  // 0.3 of 80 = 24 expected; binomial sd ~4.1
  EXPECT_LT(dropped, 36);
}

TEST(FlowTargets, TheDropDecisionIsAFixedHashOfSeedSampleAndPosition) {
  int hits = 0;
  for (std::int64_t s = 0; s < 10000; ++s) hits += teacher::context_dropped(5, s, 7, 0.25) ? 1 : 0;
  EXPECT_NEAR(hits / 10000.0, 0.25, 0.02);
  EXPECT_EQ(teacher::context_dropped(5, 3, 7, 0.25), teacher::context_dropped(5, 3, 7, 0.25));
  EXPECT_FALSE(teacher::context_dropped(5, 3, 7, 0.0));
}

}  // namespace
}  // namespace wd::test_flow_targets
