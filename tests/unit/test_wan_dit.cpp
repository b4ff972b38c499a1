// WanDiT against golden vectors made with the official Wan 2.2 code (tests/fixtures/*/README.md).
#include <gtest/gtest.h>

#include "core/errors.hpp"
#include "core/host_sync.hpp"
#include "core/torch_compat.hpp"
#include "model/image_condition.hpp"
#include "model/wan_checkpoint.hpp"
#include "model/wan_dit.hpp"

namespace wd::test_wan_dit {
namespace {

const std::string kFixtures = WD_FIXTURES;

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

/// Asserts max|got − want| <= tol and prints the margin, so CI logs show how close we are.
void expect_close(const std::string& what, const torch::Tensor& got, const torch::Tensor& want,
                  double tol) {
  const double d = max_abs_diff(got, want);
  std::printf("  %-28s max|diff| = %.3g (tolerance %.0e)\n", what.c_str(), d, tol);
  EXPECT_LE(d, tol) << what;
}

double rel_error(const torch::Tensor& got, const torch::Tensor& want) {
  auto w = want.to(torch::kDouble);
  return (got.to(torch::kDouble) - w).norm().item<double>() / w.norm().item<double>();
}

struct Golden {
  SafetensorsFile inputs, expected;
  explicit Golden(const std::string& dir, const std::string& expected_name = "expected.safetensors")
      : inputs(SafetensorsFile::open(kFixtures + "/" + dir + "/inputs.safetensors")),
        expected(SafetensorsFile::open(kFixtures + "/" + dir + "/" + expected_name)) {}
  torch::Tensor in(const std::string& k) const { return inputs.tensor(k); }
  torch::Tensor want(const std::string& k) const { return expected.tensor(k); }
};

WanDiT load(const std::string& dir, const std::string& file, std::optional<c10::ScalarType> dtype) {
  return load_wan_dit(WanCheckpoint::open(kFixtures + "/" + dir + "/" + file), dtype);
}

WanInputs tiny_a_inputs(const Golden& g) {
  return WanInputs::batched(g.in("x"), g.in("t_tokens"), g.in("context"), g.in("context_lens"),
                            g.in("seq_len").item<std::int64_t>());
}

TEST(WanDiTGolden, Fp32MatchesOfficialOutputAndIntermediates) {
  Golden g("wan-tiny-a");
  auto model = load("wan-tiny-a", "weights.safetensors", torch::kFloat);
  WanTrace trace;
  torch::NoGradGuard no_grad;
  auto out = torch::stack(model->forward(tiny_a_inputs(g), &trace));
  expect_close("out", out, g.want("out"), 2e-5);
  expect_close("patch_tokens", trace.patch_tokens, g.want("patch_tokens"), 2e-5);
  expect_close("time_emb_e", trace.time_emb_e, g.want("time_emb_e"), 2e-5);
  expect_close("time_proj_e0", trace.time_proj_e0, g.want("time_proj_e0"), 2e-5);
  expect_close("context_emb", trace.context_emb, g.want("context_emb"), 2e-5);
  expect_close("block0_out", trace.block0_out, g.want("block0_out"), 2e-5);
  expect_close("head_out", trace.head_out, g.want("head_out"), 2e-5);
}

TEST(WanDiTGolden, RopeTableMatchesOfficial) {
  Golden g("wan-tiny-a");
  auto model = load("wan-tiny-a", "weights.safetensors", torch::kFloat);
  EXPECT_LE(max_abs_diff(model->rope_cos_table().slice(0, 0, 16), g.want("rope_freqs_real")), 1e-15);
  EXPECT_LE(max_abs_diff(model->rope_sin_table().slice(0, 0, 16), g.want("rope_freqs_imag")), 1e-15);
}

TEST(WanDiTGolden, Bf16FileUpcastToFp32MatchesExpectedBf16) {
  Golden g("wan-tiny-a", "expected-bf16.safetensors");
  auto model = load("wan-tiny-a", "weights-bf16.safetensors", torch::kFloat);
  WanTrace trace;
  torch::NoGradGuard no_grad;
  auto out = torch::stack(model->forward(tiny_a_inputs(g), &trace));
  expect_close("out", out, g.want("out"), 2e-5);
  expect_close("block0_out", trace.block0_out, g.want("block0_out"), 2e-5);
  expect_close("time_proj_e0", trace.time_proj_e0, g.want("time_proj_e0"), 2e-5);
}

TEST(WanDiTGolden, Bf16ComputeStaysWithinOnePercent) {
  Golden g("wan-tiny-a");
  auto model = load("wan-tiny-a", "weights-bf16.safetensors", std::nullopt);
  ASSERT_EQ(model->dtype(), torch::kBFloat16);
  torch::NoGradGuard no_grad;
  auto out = torch::stack(model->forward(tiny_a_inputs(g)));
  EXPECT_EQ(out.scalar_type(), torch::kFloat);
  const double rel = rel_error(out, g.want("out"));
  std::printf("  bf16 compute: |out - golden| / |golden| = %.3g (tolerance 1e-2)\n", rel);
  EXPECT_LE(rel, 1e-2);
  EXPECT_GT(rel, 0.0);  // really computed in bf16, not silently in fp32
}

TEST(WanDiTGolden, Fp16WeightsStayWithinOnePercent) {
  Golden g("wan-tiny-a");
  auto model = load("wan-tiny-a", "weights.safetensors", torch::kHalf);
  ASSERT_EQ(model->dtype(), torch::kHalf);
  torch::NoGradGuard no_grad;
  auto out = torch::stack(model->forward(tiny_a_inputs(g)));
  const double rel = rel_error(out, g.want("out"));
  std::printf("  fp16 weights: |out - golden| / |golden| = %.3g (tolerance 1e-2)\n", rel);
  EXPECT_LE(rel, 1e-2);
}

// wan-tiny-b: ti2v-like, head_dim 24, two samples of different grids with H != W, token
// padding, per-token timesteps that differ per frame, a padded context, and a B=1 call.
TEST(WanDiTGolden, PerTokenTimestepsPaddingAndUnequalSamples) {
  Golden g("wan-tiny-b");
  auto model = load("wan-tiny-b", "weights.safetensors", torch::kFloat);
  WanInputs in;
  in.x = {g.in("x.0"), g.in("x.1")};
  in.t = g.in("t_tokens");
  const auto lens = g.in("context_lens");
  in.context = {g.in("context")[0].slice(0, 0, lens[0].item<std::int64_t>()),
                g.in("context")[1].slice(0, 0, lens[1].item<std::int64_t>())};
  in.seq_len = g.in("seq_len").item<std::int64_t>();
  WanTrace trace;
  torch::NoGradGuard no_grad;
  auto out = model->forward(in, &trace);
  ASSERT_EQ(out.size(), 2u);
  expect_close("out.0", out[0], g.want("out.0"), 2e-5);
  expect_close("out.1", out[1], g.want("out.1"), 2e-5);
  expect_close("time_proj_e0", trace.time_proj_e0, g.want("time_proj_e0"), 2e-5);
  expect_close("context_emb", trace.context_emb, g.want("context_emb"), 2e-5);
  // Padded rows of the hidden state never reach the output; compare the real ones.
  expect_close("block0_out[0] real rows", trace.block0_out[0].slice(0, 0, 18),
               g.want("block0_out")[0].slice(0, 0, 18), 2e-5);
  expect_close("block0_out[1] real rows", trace.block0_out[1].slice(0, 0, 16),
               g.want("block0_out")[1].slice(0, 0, 16), 2e-5);
}

TEST(WanDiTGolden, OneSampleWithScalarTimestep) {
  Golden g("wan-tiny-b");
  auto model = load("wan-tiny-b", "weights.safetensors", torch::kFloat);
  WanInputs in = WanInputs::batched(g.in("x1.0").unsqueeze(0), g.in("t1"), g.in("context1"),
                                    g.in("context_lens1"), g.in("seq_len1").item<std::int64_t>());
  torch::NoGradGuard no_grad;
  expect_close("out1.0", model->forward(in)[0], g.want("out1.0"), 2e-5);
}

TEST(WanDiTGolden, I2vChannelConcat) {
  Golden g("wan-tiny-i2v");
  auto model = load("wan-tiny-i2v", "weights.safetensors", torch::kFloat);
  WanInputs in = WanInputs::batched(torch::stack({g.in("x.0"), g.in("x.1")}), g.in("t_tokens"),
                                    g.in("context"), g.in("context_lens"),
                                    g.in("seq_len").item<std::int64_t>(),
                                    torch::stack({g.in("y.0"), g.in("y.1")}));
  torch::NoGradGuard no_grad;
  auto out = model->forward(in);
  expect_close("out.0", out[0], g.want("out.0"), 2e-5);
  expect_close("out.1", out[1], g.want("out.1"), 2e-5);
  in.y.clear();
  EXPECT_THROW(model->forward(in), Error);  // i2v without y is refused, not mis-computed
}

// Properties that follow from the spec, on random tiny models.
WanConfig small_config() {
  WanConfig c = WanConfig::preset("tiny");
  c.dim = 48;
  c.num_heads = 2;
  c.ffn_dim = 64;
  c.num_layers = 2;
  c.text_dim = 16;
  c.text_len = 6;
  c.freq_dim = 16;
  c.in_dim = 4;
  c.out_dim = 4;
  return c;
}

// y as diffusers' WanImageToVideoPipeline.prepare_latents builds it, written out the same way:
// a mask over the 4(F-1)+1 video frames (ones for the first), the first frame's entry repeated
// for the VAE's temporal stride 4, folded into [B,4,F,h,w], then the image latents.
TEST(ImageCondition, I2vMaskIsThePipelinesFoldedFirstFrameMaskBeforeTheImageLatents) {
  const std::int64_t B = 2, C = 3, F = 4, h = 2, w = 5;
  const auto latents = torch::randn({B, C, F, h, w});
  auto mask = torch::ones({B, 1, 4 * (F - 1) + 1, h, w});
  mask.narrow(2, 1, 4 * (F - 1)).zero_();
  const auto first = torch::repeat_interleave(mask.narrow(2, 0, 1), 4, 2);
  const auto folded = torch::cat({first, mask.narrow(2, 1, 4 * (F - 1))}, 2).view({B, F, 4, h, w}).transpose(1, 2);
  const auto y = i2v_condition(latents);
  EXPECT_EQ(y.sizes(), torch::IntArrayRef({B, kI2vMaskChannels + C, F, h, w}));
  EXPECT_TRUE(torch::equal(y.narrow(1, 0, kI2vMaskChannels), folded));
  EXPECT_TRUE(torch::equal(y.narrow(1, kI2vMaskChannels, C), latents));
  EXPECT_THROW(i2v_condition(latents[0]), Error);  // [C,F,h,w]: one sample without its batch
}

// TI2V-5B's image mode as the official code's masks_like and its sampler apply it: the image is
// latent frame 0, whose tokens (the first (H/2)(W/2) of the (f, h, w) order) take t = 0.
TEST(ImageCondition, Ti2vPutsTheImageInFrameZeroAtTZeroAndI2vAddsY) {
  const std::int64_t B = 2, C = 3, F = 3, H = 4, W = 6, S = 20;  // 2·3 tokens a frame, 18 + 2 padding
  const auto x = torch::randn({B, C, F, H, W}), image = torch::randn({B, C, 1, H, W});
  const auto t = torch::full({B, S}, 700.f);
  const auto in = condition_input(ImageCondition::kTi2v, image, x, t, {1, 2, 2});
  EXPECT_TRUE(torch::equal(in.x_t.narrow(2, 0, 1), image));
  EXPECT_TRUE(torch::equal(in.x_t.narrow(2, 1, F - 1), x.narrow(2, 1, F - 1)));
  EXPECT_TRUE(torch::equal(in.t.narrow(1, 0, 6), torch::zeros({B, 6})));
  EXPECT_TRUE(torch::equal(in.t.narrow(1, 6, S - 6), torch::full({B, S - 6}, 700.f)));
  EXPECT_FALSE(in.y.defined());
  EXPECT_TRUE(torch::equal(t, torch::full({B, S}, 700.f)));  // the inputs are not modified
  EXPECT_FALSE(torch::equal(x.narrow(2, 0, 1), image));
  // A sampler step moves frame 0; keep_condition puts the image back.
  const auto kept = keep_condition(ImageCondition::kTi2v, image, x + 1);
  EXPECT_TRUE(torch::equal(kept.narrow(2, 0, 1), image));
  EXPECT_TRUE(torch::equal(kept.narrow(2, 1, F - 1), (x + 1).narrow(2, 1, F - 1)));
  EXPECT_THROW(condition_input(ImageCondition::kTi2v, image, x, torch::full({B}, 700.f), {1, 2, 2}), Error);
  EXPECT_THROW(condition_input(ImageCondition::kTi2v, torch::randn({B, C, F, H, W}), x, t, {1, 2, 2}), Error);
  // i2v: y beside unchanged inputs, and nothing kept.
  const auto images = torch::randn({B, C, F, H, W});
  const auto i2v = condition_input(ImageCondition::kI2v, images, x, t, {1, 2, 2});
  EXPECT_TRUE(torch::equal(i2v.y, i2v_condition(images)));
  EXPECT_TRUE(torch::equal(i2v.x_t, x));
  EXPECT_TRUE(torch::equal(i2v.t, t));
  EXPECT_TRUE(torch::equal(keep_condition(ImageCondition::kI2v, images, x), x));
  EXPECT_TRUE(torch::equal(condition_input(ImageCondition::kTi2v, torch::Tensor(), x, t, {1, 2, 2}).x_t, x));
}

TEST(ImageCondition, TheLossLeavesOutTheFirstFrameOfSamplesWhoseFirstTokensAreClean) {
  const std::int64_t B = 3, C = 2, F = 3, H = 4, W = 4;  // 4 tokens a frame
  const auto x = torch::randn({B, C, F, H, W});
  auto t = torch::full({B, 12}, 500.f);
  t[0].narrow(0, 0, 4).zero_();  // sample 0: the image mode
  t[2].narrow(0, 0, 3).zero_();  // sample 2: three clean tokens of four is not a clean frame
  const auto w = frame_loss_weights(t, x, {1, 2, 2});
  ASSERT_EQ(w.sizes(), torch::IntArrayRef({B, 1, F, 1, 1}));
  auto want = torch::ones({B, 1, F, 1, 1});
  want[0][0][0].fill_(0);
  EXPECT_TRUE(torch::equal(w, want));
  EXPECT_FALSE(frame_loss_weights(torch::full({B}, 500.f), x, {1, 2, 2}).defined());  // per sample: all count
  const auto p = torch::randn({B, C, F, H, W}), q = torch::randn({B, C, F, H, W});
  // The mean over the frames kept: sample 0's frames 1-2 and all of samples 1 and 2.
  const auto kept = torch::cat({(p - q)[0].narrow(1, 1, F - 1).flatten(), (p - q).narrow(0, 1, 2).flatten()});
  EXPECT_NEAR(frame_weighted_mse(p, q, w).item<double>(), kept.pow(2).mean().item<double>(), 1e-6);
  EXPECT_TRUE(torch::equal(frame_weighted_mse(p, q, torch::Tensor()), torch::mse_loss(p, q)));
}

TEST(WanDiT, BatchEqualsPerSampleForDifferentTokenCounts) {
  WanDiT model(small_config(), WanInit::kRandom, torch::kFloat, 7);
  torch::NoGradGuard no_grad;
  auto x0 = torch::randn({4, 2, 4, 6}), x1 = torch::randn({4, 3, 2, 2});
  auto c0 = torch::randn({6, 16}), c1 = torch::randn({3, 16});
  WanInputs both{{x0, x1}, {}, torch::tensor({300.f, 900.f}), {c0, c1}, 0};
  auto out = model->forward(both);
  auto a = model->forward(WanInputs{{x0}, {}, torch::tensor({300.f}), {c0}, 0});
  auto b = model->forward(WanInputs{{x1}, {}, torch::tensor({900.f}), {c1}, 0});
  EXPECT_LE(max_abs_diff(out[0], a[0]), 1e-5);
  EXPECT_LE(max_abs_diff(out[1], b[0]), 1e-5);
  // Extra token padding changes nothing either.
  both.seq_len = 20;
  EXPECT_LE(max_abs_diff(model->forward(both)[1], b[0]), 1e-5);
}

TEST(WanDiT, ShortContextIsZeroPaddedNotMasked) {
  WanDiT model(small_config(), WanInit::kRandom, torch::kFloat, 8);
  torch::NoGradGuard no_grad;
  auto x = torch::randn({4, 2, 4, 4});
  auto ctx = torch::randn({3, 16});
  auto padded = torch::cat({ctx, torch::zeros({3, 16})});  // text_len 6, explicit zero rows
  auto short_out = model->forward(WanInputs{{x}, {}, torch::tensor({500.f}), {ctx}, 0})[0];
  auto padded_out = model->forward(WanInputs{{x}, {}, torch::tensor({500.f}), {padded}, 0})[0];
  // Equal: the 3 missing rows are zeros that are attended, exactly like explicit zero rows.
  EXPECT_LE(max_abs_diff(short_out, padded_out), 1e-6);
}

TEST(WanDiT, PerTokenTimestepsEqualPerSampleWhenConstant) {
  WanDiT model(small_config(), WanInit::kRandom, torch::kFloat, 9);
  torch::NoGradGuard no_grad;
  auto x = torch::randn({2, 4, 2, 6, 4});
  auto ctx = torch::randn({2, 6, 16});
  auto per_sample = torch::stack(model->forward(WanInputs::batched(x, torch::tensor({10.f, 990.f}), ctx)));
  auto per_token = torch::tensor({10.f, 990.f}).view({2, 1}).expand({2, 12}).contiguous();
  auto tok = torch::stack(model->forward(WanInputs::batched(x, per_token, ctx)));
  // Same values, different GEMM shapes: a per-sample t runs the time MLP on B rows, a per-token
  // t on B*S rows, and BLAS may block (and round) the two differently (LibTorch 2.11 on the CPU:
  // 1.01e-6 here), so the bound is the file's batch-equivalence bound, not bitwise.
  EXPECT_LE(max_abs_diff(per_sample, tok), 1e-5);
  // A different t on one frame changes that sample's output.
  auto frame0 = per_token.clone();
  frame0[0].slice(0, 0, 6).fill_(0.f);
  auto changed = torch::stack(model->forward(WanInputs::batched(x, frame0, ctx)));
  EXPECT_GT(max_abs_diff(changed[0], tok[0]), 1e-3);
  EXPECT_LE(max_abs_diff(changed[1], tok[1]), 1e-6);
}

TEST(WanDiT, BadInputsAreRefusedWithTheShapes) {
  WanDiT model(small_config(), WanInit::kRandom, torch::kFloat, 10);
  torch::NoGradGuard no_grad;
  auto ctx = torch::randn({2, 16});
  EXPECT_THROW(model->forward(WanInputs{{torch::randn({5, 2, 4, 4})}, {}, torch::tensor({1.f}), {ctx}, 0}), Error);
  EXPECT_THROW(model->forward(WanInputs{{torch::randn({4, 2, 3, 4})}, {}, torch::tensor({1.f}), {ctx}, 0}), Error);
  EXPECT_THROW(model->forward(WanInputs{{torch::randn({4, 2, 4, 4})}, {}, torch::tensor({1.f}), {torch::randn({7, 16})}, 0}), Error);
  EXPECT_THROW(model->forward(WanInputs{{torch::randn({4, 2, 4, 4})}, {}, torch::tensor({1.f}), {ctx}, 3}), Error);
  try {
    model->forward(WanInputs{{torch::randn({5, 2, 4, 4})}, {}, torch::tensor({1.f}), {ctx}, 0});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[in_dim=4,F,H,W], got [5,2,4,4]"), std::string::npos) << e.what();
  }
}

TEST(WanDiT, StagedForwardEqualsForward) {
  WanDiT model(small_config(), WanInit::kRandom, torch::kFloat, 11);
  torch::NoGradGuard no_grad;
  WanInputs in{{torch::randn({4, 2, 4, 4})}, {}, torch::tensor({100.f}), {torch::randn({6, 16})}, 0};
  auto state = model->embed(in);
  for (std::int64_t i = 0; i < 2; ++i) model->run_block(i, state);
  EXPECT_EQ(max_abs_diff(model->unembed(state)[0], model->forward(in)[0]), 0.0);
}

// Issue 23 (P1): a batch whose samples all fill S passes no key mask, so SDPA may take its flash
// kernel on a GPU. On the CPU the answer must not move: the reference formula's masked_fill with
// an all-true mask changes no score, and LibTorch 2.x's SDPA turns a boolean mask into an
// additive 0, which changes none either; so the comparison is exact, with gradients too.
TEST(WanDiT, UnpaddedBatchPassesNoMaskAndEqualsTheMaskedForwardExactly) {
  WanDiT model(small_config(), WanInit::kRandom, torch::kFloat, 12);
  torch::manual_seed(5);
  const auto x = torch::randn({3, 4, 2, 4, 6}), ctx = torch::randn({3, 6, 16});
  const auto in = WanInputs::batched(x, torch::tensor({10.f, 500.f, 990.f}), ctx, torch::tensor({6, 3, 5}));
  const auto run = [&](bool force_mask, torch::Tensor& grad_q) {
    model->zero_grad();
    auto state = model->embed(in);
    EXPECT_FALSE(state.key_mask.defined()) << "every sample has S = 12 tokens";
    if (force_mask) state.key_mask = torch::ones({3, 1, 1, state.x.size(1)}, torch::kBool);
    for (std::int64_t i = 0; i < 2; ++i) model->run_block(i, state);
    auto out = torch::stack(model->unembed(state));
    out.pow(2).sum().backward();
    grad_q = model->named_parameters()["blocks.0.self_attn.q.weight"].grad().clone();
    return out.detach();
  };
  torch::Tensor grad_plain, grad_masked;
  const auto plain = run(false, grad_plain);
  const auto masked = run(true, grad_masked);
  EXPECT_TRUE(torch::equal(plain, masked)) << "max diff " << max_abs_diff(plain, masked);
  EXPECT_TRUE(torch::equal(grad_plain, grad_masked)) << "max diff " << max_abs_diff(grad_plain, grad_masked);

  // Padding, by seq_len or by a smaller sample, brings the mask back, true on the real tokens.
  torch::NoGradGuard no_grad;
  auto longer = in;
  longer.seq_len = 16;
  const auto mask = model->embed(longer).key_mask;
  ASSERT_TRUE(mask.defined());
  EXPECT_EQ(mask.sizes(), (std::vector<std::int64_t>{3, 1, 1, 16}));
  EXPECT_EQ(mask.sum().item<std::int64_t>(), 3 * 12);
  EXPECT_TRUE(mask.slice(-1, 0, 12).all().item<bool>());
  const WanInputs mixed{{x[0], torch::randn({4, 2, 2, 6})}, {}, torch::tensor({1.f, 2.f}), {ctx[0], ctx[1]}, 0};
  const auto mixed_mask = model->embed(mixed).key_mask;
  ASSERT_TRUE(mixed_mask.defined());
  EXPECT_EQ(mixed_mask[1].sum().item<std::int64_t>(), 6);
  // Different grids with equal token counts (2x4x6 and 2x6x4 latents: 12 tokens each) need none.
  const WanInputs turned{{x[0], torch::randn({4, 2, 6, 4})}, {}, torch::tensor({1.f, 2.f}), {ctx[0], ctx[1]}, 0};
  EXPECT_FALSE(model->embed(turned).key_mask.defined());
}

// Issue 23 (P3): the model's forward on host tensors makes no host synchronisation. The context
// lengths arrive as a host tensor and are read there; a device tensor would cost one counted
// wait, which this CPU-only run cannot make. Every other read of the inputs is shape metadata.
TEST(WanDiT, ForwardOnHostInputsMakesNoHostSync) {
  WanDiT model(small_config(), WanInit::kRandom, torch::kFloat, 13);
  torch::manual_seed(6);
  const auto x = torch::randn({2, 4, 2, 4, 4}), ctx = torch::randn({2, 6, 16});
  const auto lens = torch::tensor({6, 4}, torch::kInt);
  const auto before = host_sync_count();
  const auto in = WanInputs::batched(x, torch::tensor({100.f, 700.f}), ctx, lens);
  auto out = torch::stack(model->forward(in));
  out.sum().backward();
  EXPECT_EQ(host_sync_count() - before, 0);
  EXPECT_EQ(in.context[1].size(0), 4);
}

// Issue 23 (P7): WanInputs::batched keeps the batch tensors, so embed moves each in one copy;
// the answer equals the per-sample path of the same inputs given as lists, bit for bit, and a
// list entry replaced after batched() is honoured (the stale batch is not used).
TEST(WanDiT, BatchedUploadEqualsPerSampleUploadExactly) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    auto cfg = small_config();
    cfg.model_type = "i2v";
    cfg.in_dim = 6;  // 4 latent channels + 2 of y
    WanDiT model(cfg, WanInit::kRandom, dtype, 14);
    torch::NoGradGuard no_grad;
    torch::manual_seed(7);
    const auto x = torch::randn({2, 4, 2, 4, 4}), y = torch::randn({2, 2, 2, 4, 4});
    const auto ctx = torch::randn({2, 5, 16}, torch::kDouble);  // converted on the way, as a list would be
    const auto t = torch::tensor({100.f, 700.f});
    auto in = WanInputs::batched(x, t, ctx, torch::tensor({5, 2}), 0, y);
    const WanInputs listed{{x[0], x[1]}, {y[0], y[1]}, t, {ctx[0], ctx[1].slice(0, 0, 2)}, 0};
    const auto a = torch::stack(model->forward(in)), b = torch::stack(model->forward(listed));
    EXPECT_TRUE(torch::equal(a, b)) << "max diff " << max_abs_diff(a, b);
    in.x[1] = torch::randn({4, 2, 4, 4});
    in.context[0] = torch::randn({3, 16});
    const WanInputs changed{{x[0], in.x[1]}, {y[0], y[1]}, t, {in.context[0], ctx[1].slice(0, 0, 2)}, 0};
    EXPECT_TRUE(torch::equal(torch::stack(model->forward(in)), torch::stack(model->forward(changed))));
  }
}

TEST(Compat, AttentionEqualsReferenceInFp32) {
  auto q = torch::randn({2, 3, 5, 8}), k = torch::randn({2, 3, 7, 8}), v = torch::randn({2, 3, 7, 8});
  auto mask = torch::ones({2, 1, 1, 7}, torch::kBool);
  mask[1].slice(-1, 4, 7).fill_(false);
  EXPECT_LE(max_abs_diff(compat::attention(q, k, v, mask), compat::attention_reference(q, k, v, mask)), 1e-6);
  EXPECT_LE(max_abs_diff(compat::attention(q, k, v), compat::attention_reference(q, k, v)), 1e-6);
}

// The padded keys of a shorter sample must not reach its output at all: with the fused kernel
// (LibTorch 2.x) as with the reference formula, any values there leave the result bit-equal,
// and a fully masked-out tail equals attention over the unpadded keys alone.
TEST(Compat, MaskedKeysHaveNoInfluence) {
  SCOPED_TRACE(std::string("fused attention: ") + (compat::kHasFusedAttention ? "yes" : "no"));
  torch::manual_seed(3);
  auto q = torch::randn({2, 3, 5, 8}), k = torch::randn({2, 3, 7, 8}), v = torch::randn({2, 3, 7, 8});
  auto mask = torch::ones({2, 1, 1, 7}, torch::kBool);
  mask[1].slice(-1, 4, 7).fill_(false);
  const auto out = compat::attention(q, k, v, mask);
  auto k2 = k.clone(), v2 = v.clone();
  k2[1].slice(1, 4, 7).fill_(1e4);
  v2[1].slice(1, 4, 7).fill_(-1e4);
  EXPECT_TRUE(torch::equal(compat::attention(q, k2, v2, mask), out));
  const auto unpadded = compat::attention(q[1].unsqueeze(0), k[1].slice(1, 0, 4).unsqueeze(0),
                                          v[1].slice(1, 0, 4).unsqueeze(0));
  EXPECT_LE(max_abs_diff(out[1].unsqueeze(0), unpadded), 1e-6);
  EXPECT_LE(max_abs_diff(out[0], compat::attention(q, k, v)[0]), 1e-6) << "the unmasked sample";
}

TEST(WanConfigTest, PresetParameterCountsMatchTheOfficialModels) {
  EXPECT_EQ(wan_param_count(WanConfig::preset("wan22-ti2v-5b")), 4'999'787'712);
  EXPECT_EQ(wan_param_count(WanConfig::preset("wan22-t2v-a14b")), 14'288'491'584);
  EXPECT_EQ(wan_param_count(WanConfig::preset("wan22-i2v-a14b")), 14'288'901'184);
  EXPECT_EQ(wan_param_specs(WanConfig::preset("wan22-ti2v-5b")).size(), 825u);
  EXPECT_EQ(wan_param_specs(WanConfig::preset("wan22-t2v-a14b")).size(), 1095u);
  EXPECT_LT(wan_param_count(WanConfig::preset("tiny")) * 4, 8'000'000);  // "a few MB"
}

TEST(WanConfigTest, NativeConfigDefaultsOmittedFieldsAndParsesDiffusers) {
  auto c = WanConfig::from_json(R"({"_class_name":"WanModel","model_type":"ti2v","dim":3072,
      "ffn_dim":14336,"freq_dim":256,"in_dim":48,"out_dim":48,"num_heads":24,"num_layers":30,
      "text_len":512,"eps":1e-06})", "official.json");
  EXPECT_EQ(c.text_dim, 4096);
  EXPECT_EQ(c.patch_size, (std::array<std::int64_t, 3>{1, 2, 2}));
  EXPECT_TRUE(c.qk_norm && c.cross_attn_norm);
  auto d = WanConfig::from_json(R"({"_class_name":"WanTransformer3DModel","num_attention_heads":40,
      "attention_head_dim":128,"in_channels":36,"out_channels":16,"text_dim":4096,"freq_dim":256,
      "ffn_dim":13824,"num_layers":40,"cross_attn_norm":true,"qk_norm":"rms_norm_across_heads",
      "eps":1e-06,"patch_size":[1,2,2],"image_dim":null})", "diffusers.json");
  EXPECT_EQ(d.dim, 5120);
  EXPECT_EQ(d.model_type, "i2v");
  EXPECT_EQ(wan_param_count(d), 14'288'901'184);
  // diffusers' own files carry no text_len (the pipelines pad to 512) and a null qk_norm still
  // normalises (diffusers' attention always has norm_q / norm_k).
  EXPECT_EQ(d.text_len, 512);
  auto null_qk = WanConfig::from_json(R"({"_class_name":"WanTransformer3DModel","qk_norm":null})", "d.json");
  EXPECT_TRUE(null_qk.qk_norm);
  EXPECT_THROW(WanConfig::from_json(R"({"num_attention_heads":40,"added_kv_proj_dim":5120})", "d.json"),
               DataError);
  try {
    WanConfig::from_json(R"({"dim":100,"num_heads":3,"window_size":[4,4]})", "bad.json");
    FAIL() << "accepted a bad config";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("bad.json"), std::string::npos) << m;
    EXPECT_NE(m.find("dim(100) must be divisible by num_heads(3)"), std::string::npos) << m;
    EXPECT_NE(m.find("window_size(4,4)"), std::string::npos) << m;
  }
}

TEST(WanConfigTest, DiffusersConfigRoundTripsEveryField) {
  auto odd = WanConfig::preset("tiny");
  odd.model_type = "ti2v";  // not what in_dim 16 would suggest
  odd.text_len = 16;
  odd.patch_size = {1, 2, 3};
  odd.cross_attn_norm = false;
  odd.eps = 1e-5;
  for (const auto& c : {WanConfig::preset("wan22-ti2v-5b"), WanConfig::preset("wan22-i2v-a14b"), odd}) {
    const auto back = WanConfig::from_json(c.to_diffusers_json(), "diffusers.json");
    EXPECT_EQ(back.to_json(), c.to_json());
  }
  const auto five_b = WanConfig::preset("wan22-ti2v-5b").to_diffusers_json();
  for (const char* field : {R"("_class_name": "WanTransformer3DModel")", R"("attention_head_dim": 128)",
                            R"("num_attention_heads": 24)", R"("in_channels": 48)", R"("image_dim": null)",
                            R"("added_kv_proj_dim": null)", R"("pos_embed_seq_len": null)"}) {
    EXPECT_NE(five_b.find(field), std::string::npos) << field << "\n" << five_b;
  }
  auto no_qk = WanConfig::preset("tiny");
  no_qk.qk_norm = false;
  EXPECT_THROW(no_qk.to_diffusers_json(), ConfigError);
}

}  // namespace
}  // namespace wd::test_wan_dit
