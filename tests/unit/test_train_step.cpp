// train_step on a two-parameter line fit against AdamW worked out by hand: accumulation over
// micro-batches, the reduce, the clip, decoupled weight decay, bias correction, the hooks, and
// a NaN loss stopped before the gradients leave the rank.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.hpp"
#include "core/host_sync.hpp"
#include "student/train_step.hpp"

namespace wd::student::test_train_step {
namespace {

/// Two points per micro-batch: (x, y) pairs of the line fit.
struct Points {
  std::vector<double> x, y;
};

const std::vector<Points> kMicro = {{{1.0, 2.0}, {3.0, 1.0}}, {{-1.0, 0.5}, {0.0, 2.0}}};

std::vector<comm::TensorDict> as_batches(const std::vector<Points>& micro) {
  std::vector<comm::TensorDict> out;
  for (const auto& m : micro) {
    out.push_back({{"x", torch::tensor(m.x, torch::kDouble)}, {"y", torch::tensor(m.y, torch::kDouble)}});
  }
  return out;
}

/// y ≈ w·x + b, loss mean((w·x + b − y)²): two scalar parameters in double.
class LineFit final : public Objective {
 public:
  LineFit(double w, double b)
      : params_{torch::tensor(w, torch::kDouble).requires_grad_(), torch::tensor(b, torch::kDouble).requires_grad_()} {}
  const std::vector<torch::Tensor>& parameters() const override { return params_; }
  void zero_grad() override {
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  }
  torch::Tensor backward(const comm::TensorDict& batch, double scale) override {
    const auto loss = (params_[0] * batch.at("x") + params_[1] - batch.at("y")).pow(2).mean();
    (loss * scale).backward();
    return loss.detach();
  }
  void after_step() override { ++after_steps; }

  double w() const { return params_[0].item<double>(); }
  double b() const { return params_[1].item<double>(); }
  int after_steps = 0;

 private:
  std::vector<torch::Tensor> params_;
};

/// Stands in for the group average: scales every gradient by `factor` (a peer with zero grads
/// would halve them), so the test sees that the clip and the update use the reduced gradients.
class ScalingReducer final : public comm::GradientReducer {
 public:
  ScalingReducer(std::vector<torch::Tensor> params, double factor)
      : comm::GradientReducer(nullptr), params_(std::move(params)), factor_(factor) {}
  void average(std::int64_t) override {
    ++calls;
    for (auto& p : params_) p.mutable_grad().mul_(factor_);
  }
  std::size_t bucket_count() const override { return 0; }
  double wait_seconds() const override { return 0; }
  const char* backend() const override { return "test"; }
  int calls = 0;

 private:
  std::vector<torch::Tensor> params_;
  double factor_;
};

/// AdamW by formula, as LibTorch's AdamW does it: decoupled decay p ← p·(1 − lr·wd), moments
/// m ← β1·m + (1 − β1)·g and v ← β2·v + (1 − β2)·g², then p ← p − lr/(1 − β1^t) · m /
/// (√v / √(1 − β2^t) + ε).
struct HandAdamW {
  double wd, beta1, beta2, eps;
  double p[2], m[2] = {0, 0}, v[2] = {0, 0};
  double g[2] = {0, 0};  ///< the gradients of the last step, as the update used them
  int t = 0;

  /// The gradients of the mean micro-batch loss at the current (w, b), reduced by `reduce`
  /// and clipped to `clip` (0: none) as clip_grad_norm does; returns the mean loss.
  double step(double lr, double reduce, double clip) {
    g[0] = g[1] = 0;
    double mean_loss = 0;
    const double scale = 1.0 / static_cast<double>(kMicro.size());
    for (const auto& mb : kMicro) {
      const double n = static_cast<double>(mb.x.size());
      double loss = 0;
      for (std::size_t i = 0; i < mb.x.size(); ++i) {
        const double r = p[0] * mb.x[i] + p[1] - mb.y[i];
        loss += r * r / n;
        g[0] += scale * 2 * r * mb.x[i] / n;
        g[1] += scale * 2 * r / n;
      }
      mean_loss += scale * loss;
    }
    for (double& gi : g) gi *= reduce;
    if (clip > 0) {
      const double norm = std::sqrt(g[0] * g[0] + g[1] * g[1]);
      const double factor = std::min(1.0, clip / (norm + 1e-6));
      for (double& gi : g) gi *= factor;
    }
    ++t;
    for (int i = 0; i < 2; ++i) {
      p[i] *= 1 - lr * wd;
      m[i] = beta1 * m[i] + (1 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
      const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(beta2, t)) + eps;
      p[i] -= lr / (1 - std::pow(beta1, t)) * m[i] / denom;
    }
    return mean_loss;
  }
};

void expect_steps_match(double clip) {
  constexpr double kWd = 0.1, kBeta1 = 0.9, kBeta2 = 0.99, kEps = 1e-8;
  LineFit fit(0.5, -0.25);
  TrainOptimizer optimizer(fit.parameters(),
                           torch::optim::AdamWOptions(1.0).betas({kBeta1, kBeta2}).eps(kEps).weight_decay(kWd));
  ScalingReducer reducer(fit.parameters(), 0.5);
  int hooks = 0;
  StepContext context{fit, optimizer, &reducer, clip, 0, [&] { ++hooks; }};
  FixedBatches batches(as_batches(kMicro));
  HandAdamW hand{kWd, kBeta1, kBeta2, kEps, {0.5, -0.25}};
  for (std::int64_t step = 0; step < 3; ++step) {
    const double lr = 0.1 / static_cast<double>(step + 1);  // a schedule: the step sets each lr
    const auto syncs = host_sync_count();
    const double loss = train_step(context, step, lr, batches);
    EXPECT_EQ(host_sync_count() - syncs, 1) << "one counted read of the losses per step";
    const double expected_loss = hand.step(lr, 0.5, clip);
    EXPECT_NEAR(loss, expected_loss, 1e-12 * expected_loss) << "step " << step;
    EXPECT_NEAR(fit.w(), hand.p[0], 1e-12) << "step " << step;
    EXPECT_NEAR(fit.b(), hand.p[1], 1e-12) << "step " << step;
    // The gradients stay until the next step: reduced and clipped, as the update saw them.
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(fit.parameters()[i].grad().item<double>(), hand.g[i], 1e-12) << "step " << step << " grad " << i;
    }
  }
  EXPECT_EQ(reducer.calls, 3);
  EXPECT_EQ(fit.after_steps, 3);
  EXPECT_EQ(hooks, 3);
}

TEST(TrainStep, IsAdamWByHandOverTheReducedAccumulatedGradients) { expect_steps_match(0); }

TEST(TrainStep, ClipsTheReducedGradientsBeforeTheUpdate) {
  // The first step's reduced gradient norm is about 1.7: a limit of 0.05 clips every step.
  expect_steps_match(0.05);
}

TEST(TrainStep, ANonFiniteLossThrowsBeforeTheReduceAndTheUpdate) {
  LineFit fit(0.5, -0.25);
  TrainOptimizer optimizer(fit.parameters(), torch::optim::AdamWOptions(0.1));
  ScalingReducer reducer(fit.parameters(), 0.5);
  StepContext context{fit, optimizer, &reducer, 1.0, 3};
  auto micro = kMicro;
  micro[1].y[0] = std::numeric_limits<double>::quiet_NaN();
  FixedBatches batches(as_batches(micro));
  try {
    train_step(context, 6, 0.1, batches);
    FAIL() << "no NumericalError";
  } catch (const NumericalError& e) {
    EXPECT_NE(std::string(e.what()).find("step 7 (micro-batch 1) is nan on rank 3"), std::string::npos) << e.what();
  }
  EXPECT_EQ(reducer.calls, 0);
  EXPECT_EQ(fit.after_steps, 0);
  EXPECT_EQ(fit.w(), 0.5);
  EXPECT_EQ(fit.b(), -0.25);
  EXPECT_TRUE(optimizer.adamw().state().empty());
}

}  // namespace
}  // namespace wd::student::test_train_step
