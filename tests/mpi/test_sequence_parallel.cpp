// Ulysses sequence parallelism on 2 and 4 ranks (issue 45): the all-to-all's layouts, and a tiny
// fp32 DiT whose forward and weight gradients, with each rank holding 1/N of every sample's
// tokens, equal one rank's over the whole sequence (t2v, ti2v's per-token t, i2v's y, token
// counts the group does not divide, samples of different lengths).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "comm/mpi_token_head_exchange.hpp"
#include "model/wan_dit.hpp"
#include "mpi_test_util.hpp"

namespace wd::test_sequence_parallel {
namespace {

using test::failures_anywhere;
using test::world_rank;
using test::world_size;

constexpr double kTimeoutS = 60;
constexpr double kTolerance = 1e-5;  // relative, fp32

using Shape = std::array<std::int64_t, 3>;  // latent F, H, W (patch 1×2×2)

WanConfig tiny(const std::string& type, std::int64_t heads = 4) {
  WanConfig c = WanConfig::preset("tiny");
  c.model_type = type;
  c.num_heads = heads;
  c.dim = 12 * heads;  // head_dim 12
  c.ffn_dim = 64;
  c.num_layers = 2;
  c.text_dim = 16;
  c.text_len = 6;
  c.freq_dim = 16;
  c.in_dim = type == "i2v" ? 6 : 4;  // i2v: 4 latent channels + 2 of y
  c.out_dim = 4;
  return c;
}

std::int64_t tokens_of(const Shape& s) { return s[0] * (s[1] / 2) * (s[2] / 2); }

/// The same inputs on every rank (seeded): a sample per shape; ti2v gets per-token t with the
/// first latent frame's tokens at 0, the others t per sample.
WanInputs inputs_of(const WanConfig& c, const std::vector<Shape>& shapes) {
  torch::manual_seed(11);
  WanInputs in;
  std::int64_t S = 0;
  for (std::size_t b = 0; b < shapes.size(); ++b) {
    const auto [F, H, W] = shapes[b];
    in.x.push_back(torch::randn({4, F, H, W}));
    if (c.model_type == "i2v") in.y.push_back(torch::randn({2, F, H, W}));
    in.context.push_back(torch::randn({3 + static_cast<std::int64_t>(b), c.text_dim}));
    S = std::max(S, tokens_of(shapes[b]));
  }
  const auto B = static_cast<std::int64_t>(shapes.size());
  in.t = torch::linspace(100, 700, B);
  if (c.model_type == "ti2v") {
    in.t = torch::full({B, S}, 650.f);
    for (std::int64_t b = 0; b < B; ++b) in.t[b].slice(0, 0, shapes[b][1] / 2 * (shapes[b][2] / 2)).zero_();
  }
  return in;
}

double relative_diff(const torch::Tensor& a, const torch::Tensor& ref) {
  return (a - ref).abs().max().item<double>() / std::max(ref.abs().max().item<double>(), 1e-30);
}

struct Case {
  std::string name, type;
  std::vector<Shape> shapes;
};

std::vector<Case> cases() {
  return {{"t2v 12+12 tokens", "t2v", {{2, 4, 6}, {2, 4, 6}}},
          {"t2v 12+5 tokens (padded sample)", "t2v", {{2, 4, 6}, {5, 2, 2}}},
          {"t2v 7+7 tokens (N does not divide)", "t2v", {{7, 2, 2}, {7, 2, 2}}},
          {"ti2v per-token t, 9+9 tokens", "ti2v", {{3, 2, 6}, {3, 2, 6}}},
          {"i2v y, 10+6 tokens", "i2v", {{5, 2, 4}, {3, 2, 4}}}};
}

/// Loss weights [B, S, patch·out_dim], zero on each sample's padding, the same on every rank.
torch::Tensor loss_weights(const std::vector<Shape>& shapes, std::int64_t S, std::int64_t features) {
  torch::manual_seed(23);
  auto w = torch::randn({static_cast<std::int64_t>(shapes.size()), S, features});
  for (std::size_t b = 0; b < shapes.size(); ++b) w[static_cast<std::int64_t>(b)].slice(0, tokens_of(shapes[b])).zero_();
  return w;
}

/// Each parameter's .grad, flattened in named_parameters order; cleared afterwards.
std::vector<torch::Tensor> take_grads(WanDiT& model) {
  std::vector<torch::Tensor> out;
  for (auto& p : model->parameters()) {
    out.push_back(p.grad().defined() ? p.grad().detach().clone().reshape({-1}) : torch::zeros({p.numel()}));
    p.mutable_grad() = torch::Tensor();
  }
  return out;
}

TEST(TokenHeadExchange, ToHeadsGivesEveryTokenOfThisRanksHeadsAndToTokensInvertsIt) {
  comm::MpiTokenHeadExchange group(MPI_COMM_WORLD, kTimeoutS);
  const std::int64_t n = world_size(), r = world_rank(), B = 2, Sl = 3, H = 2 * n, d = 5;
  // Element value: 1000·global token + 10·head + b (d copies).
  const auto global = torch::arange(r * Sl, (r + 1) * Sl).view({1, Sl, 1, 1});
  const auto x = (1000 * global + 10 * torch::arange(H).view({1, 1, H, 1}) + torch::arange(B).view({B, 1, 1, 1}))
                     .expand({B, Sl, H, d}).to(torch::kFloat).contiguous();
  const auto heads = group.to_heads(x);
  const auto all = torch::arange(n * Sl).view({1, n * Sl, 1, 1});
  const auto mine = torch::arange(r * 2, r * 2 + 2).view({1, 1, 2, 1});
  const auto want = (1000 * all + 10 * mine + torch::arange(B).view({B, 1, 1, 1})).expand({B, n * Sl, 2, d}).to(torch::kFloat);
  int bad = torch::equal(heads, want) ? 0 : 1;
  bad += torch::equal(group.to_tokens(heads), x) ? 0 : 1;
  const auto gathered = group.gather_tokens(x.select(3, 0).select(2, 0).unsqueeze(2));
  const auto want_gathered = (1000 * torch::arange(n * Sl).view({1, n * Sl}) + torch::arange(B).view({B, 1})).to(torch::kFloat);
  bad += torch::equal(gathered.squeeze(2), want_gathered) ? 0 : 1;
  EXPECT_EQ(failures_anywhere(bad), 0);
}

TEST(SequenceParallelDiT, ForwardAndSummedWeightGradientsEqualOneRanksFp32) {
  comm::MpiTokenHeadExchange group(MPI_COMM_WORLD, kTimeoutS);
  int bad = 0;
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto cfg = tiny(c.type);
    WanDiT model(cfg, WanInit::kRandom, torch::kFloat, 5);
    auto in = inputs_of(cfg, c.shapes);
    const auto S = std::max(tokens_of(c.shapes[0]), tokens_of(c.shapes[1]));
    const auto features = cfg.patch_volume() * cfg.out_dim;

    // One rank: the whole sequence.
    std::vector<torch::Tensor> want;
    {
      torch::NoGradGuard no_grad;
      want = model->forward(in);
    }
    const auto w = loss_weights(c.shapes, S, features);
    (model->forward_tokens(in) * w).sum().backward();
    const auto want_grads = take_grads(model);

    // The group: this rank's tokens; its loss is its rows' share, the group's sum the whole.
    in.sequence_parallel = &group;
    std::vector<torch::Tensor> got;
    {
      torch::NoGradGuard no_grad;
      got = model->forward(in);
    }
    const auto rows = model->forward_tokens(in);
    const auto total = rows.size(1) * world_size();
    const auto w_padded = torch::cat({w, torch::zeros({w.size(0), total - S, features})}, 1);
    (rows * w_padded.slice(1, world_rank() * rows.size(1), (world_rank() + 1) * rows.size(1))).sum().backward();
    auto grads = take_grads(model);

    double out_diff = 0, grad_diff = 0;
    for (std::size_t b = 0; b < want.size(); ++b) out_diff = std::max(out_diff, relative_diff(got[b], want[b]));
    for (std::size_t i = 0; i < grads.size(); ++i) {
      MPI_Allreduce(MPI_IN_PLACE, grads[i].data_ptr<float>(), static_cast<int>(grads[i].numel()), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      grad_diff = std::max(grad_diff, relative_diff(grads[i], want_grads[i]));
    }
    if (world_rank() == 0) {
      std::printf("[N=%d] %s: S=%lld, %lld tokens a rank; output max rel diff %.3g, weight grads max rel diff %.3g\n",
                  world_size(), c.name.c_str(), static_cast<long long>(S), static_cast<long long>(rows.size(1)),
                  out_diff, grad_diff);
    }
    EXPECT_LE(out_diff, kTolerance);
    EXPECT_LE(grad_diff, kTolerance);
    bad += out_diff <= kTolerance && grad_diff <= kTolerance ? 0 : 1;
  }
  EXPECT_EQ(failures_anywhere(bad), 0);
}

/// The message of the ConfigError `f` throws ("" when it throws none).
template <typename F>
std::string config_error_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(SequenceParallelDiT, HeadsTheGroupDoesNotDivideAndTooFewTokensAreClearErrors) {
  comm::MpiTokenHeadExchange group(MPI_COMM_WORLD, kTimeoutS);
  const auto n = world_size();
  const auto heads = static_cast<std::int64_t>(n) + 1;  // never divisible by n >= 2
  WanDiT model(tiny("t2v", heads), WanInit::kRandom, torch::kFloat, 5);
  auto in = inputs_of(tiny("t2v", heads), {{2, 4, 6}, {2, 4, 6}});
  in.sequence_parallel = &group;
  const auto heads_error = config_error_of([&] { model->forward(in); });
  const auto named = "num_heads (" + std::to_string(heads) + ") divisible by it; sizes that work: 1, " +
                     std::to_string(heads);
  EXPECT_NE(heads_error.find(named), std::string::npos) << heads_error;

  WanDiT four(tiny("t2v"), WanInit::kRandom, torch::kFloat, 5);
  auto one_token = inputs_of(tiny("t2v"), {{1, 2, 2}, {1, 2, 2}});
  one_token.sequence_parallel = &group;
  const auto tokens_error = config_error_of([&] { four->forward(one_token); });
  EXPECT_NE(tokens_error.find("needs at least " + std::to_string(n) + " tokens, the batch has 1"), std::string::npos)
      << tokens_error;
  const auto raw_error = config_error_of([&] { group.to_heads(torch::zeros({1, 2, heads, 4})); });
  EXPECT_NE(raw_error.find("sizes that divide them: 1, " + std::to_string(heads)), std::string::npos) << raw_error;
  EXPECT_EQ(failures_anywhere(heads_error.empty() || tokens_error.empty() || raw_error.empty() ? 1 : 0), 0);
}

}  // namespace
}  // namespace wd::test_sequence_parallel
