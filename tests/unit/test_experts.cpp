// WanExperts: the A14B two-expert teacher — routing at the boundary, the reference MoE forward,
// the checks on the folder (official or diffusers pipeline) and its configs, and init-teacher /
// inspect / plan on such a folder.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/errors.hpp"
#include "model/diffusers_pipeline.hpp"
#include "model/wan_experts.hpp"
#include "test_util.hpp"

namespace wd::test_experts {
namespace {

namespace fs = std::filesystem;
using test::contains;
using test::TempDir;

const std::string kCli = WD_CLI;

WanConfig tiny(const std::string& model_type = "t2v") {
  auto c = WanConfig::preset("tiny");
  c.model_type = model_type;
  if (model_type == "i2v") c.in_dim = 36;  // 16 noisy + 4 mask + 16 image latent
  return c;
}

/// A random two-expert folder of the tiny preset in fp32, one shard per expert.
void write_pair(const TempDir& dir, const WanConfig& config, std::uint64_t seed = 5) {
  write_random_wan_experts(dir.str(), config, torch::kFloat, 1ULL << 30, seed);
}

std::vector<std::vector<std::int64_t>> routes(std::vector<std::int64_t> low,
                                              std::vector<std::int64_t> high) {
  return {std::move(low), std::move(high)};
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(WanExpertsRouting, T2vBoundaryComparesTheTruncatedTimestep) {
  TempDir dir("wd-experts");
  write_pair(dir, tiny("t2v"));
  const auto ex = WanExperts::open(dir.str());
  ASSERT_TRUE(ex.two_experts());
  EXPECT_EQ(ex.boundary(), 0.875);
  EXPECT_EQ(ex.boundary_timestep(), 875.0);
  // 874.9 truncates to 874 < 875: low; 875.0 and 875.9 (-> 875): high.
  EXPECT_EQ(ex.expert_for(874.9), WanExperts::kLow);
  EXPECT_EQ(ex.expert_for(875.0), WanExperts::kHigh);
  EXPECT_EQ(ex.expert_for(875.9), WanExperts::kHigh);
  EXPECT_EQ(ex.expert_for(0.0), WanExperts::kLow);
  EXPECT_EQ(ex.expert_for(999.0), WanExperts::kHigh);
  // The same through a float32 [B] tensor, as the teacher receives t.
  const auto t = torch::tensor({874.9f, 875.0f, 875.9f, 0.f, 999.f, 874.99f});
  EXPECT_EQ(ex.route(t), routes({0, 3, 5}, {1, 2, 4}));
  EXPECT_TRUE(contains(error_of([&] { ex.expert_for(std::nan("")); }), "must be finite"));
}

TEST(WanExpertsRouting, I2vBoundaryIsNineHundred) {
  TempDir dir("wd-experts");
  write_pair(dir, tiny("i2v"));
  const auto ex = WanExperts::open(dir.str());
  EXPECT_EQ(ex.boundary(), 0.9);
  EXPECT_EQ(ex.route(torch::tensor({899.9f, 900.f, 900.5f, 875.f})), routes({0, 3}, {1, 2}));
}

TEST(WanExpertsRouting, PerTokenTimestepsRouteWhenConstantPerSampleAndAreRefusedOtherwise) {
  TempDir dir("wd-experts");
  write_pair(dir, tiny());
  const auto ex = WanExperts::open(dir.str());
  const auto per_sample = torch::tensor({100.f, 950.f, 875.f});
  const auto per_token = per_sample.view({3, 1}).expand({3, 12}).contiguous();
  EXPECT_EQ(ex.route(per_token), routes({0}, {1, 2}));
  auto varying = per_token.clone();
  varying[2][0] = 0.f;  // sample 2's first frame at t = 0, as TI2V i2v does
  const auto msg = error_of([&] { ex.route(varying); });
  EXPECT_TRUE(contains(msg, "sample 2 has per-token timesteps that vary")) << msg;
  EXPECT_TRUE(contains(msg, dir.str())) << msg;
}

TEST(WanExpertsRouting, OneExpertTakesEverySample) {
  TempDir dir("wd-experts");
  write_random_wan_checkpoint(dir.str(), tiny(), torch::kFloat, 1ULL << 30, 3);
  const auto ex = WanExperts::open(dir.str());
  EXPECT_FALSE(ex.two_experts());
  EXPECT_EQ(ex.size(), 1u);
  const auto r = ex.route(torch::tensor({10.f, 990.f, 500.f}));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0], (std::vector<std::int64_t>{0, 1, 2}));
  // Varying per-token t is fine for a dense model (TI2V-5B).
  EXPECT_EQ(ex.route(torch::tensor({{0.f, 500.f}, {500.f, 500.f}}))[0].size(), 2u);
}

TEST(WanExpertsBoundary, DefaultsExplicitValuesAndRefusals) {
  EXPECT_EQ(default_expert_boundary("t2v"), std::optional<double>(0.875));
  EXPECT_EQ(default_expert_boundary("i2v"), std::optional<double>(0.9));
  EXPECT_FALSE(default_expert_boundary("ti2v").has_value());

  TempDir dir("wd-experts");
  write_pair(dir, tiny("ti2v"));
  // A two-expert folder of a type without a Wan 2.2 boundary must be told one.
  const auto msg = error_of([&] { WanExperts::open(dir.str()); });
  EXPECT_TRUE(contains(msg, "boundary")) << msg;
  EXPECT_TRUE(contains(msg, "model_type(ti2v)")) << msg;
  EXPECT_TRUE(contains(msg, dir.str())) << msg;
  EXPECT_THROW(WanExperts::open(dir.str()), ConfigError);
  const auto ex = WanExperts::open(dir.str(), 0.7);
  EXPECT_EQ(ex.boundary(), 0.7);
  EXPECT_EQ(ex.expert_for(699.9), WanExperts::kLow);
  EXPECT_EQ(ex.expert_for(700.0), WanExperts::kHigh);

  // An explicit boundary overrides the t2v default; it must lie strictly inside (0, 1).
  TempDir t2v("wd-experts");
  write_pair(t2v, tiny("t2v"));
  EXPECT_EQ(WanExperts::open(t2v.str(), 0.5).route(torch::tensor({499.9f, 500.f})),
            routes({0}, {1}));
  // A boundary between integers shows the truncation: 875.9 is the sampler's 875 < 875.5.
  const auto half = WanExperts::open(t2v.str(), 0.8755);
  EXPECT_EQ(half.route(torch::tensor({875.9f, 876.f, 875.5f})), routes({0, 2}, {1}));
  for (const double bad : {0.0, 1.0, -0.1, 875.0}) {
    const auto m = error_of([&] { WanExperts::open(t2v.str(), bad); });
    EXPECT_TRUE(contains(m, "must lie in (0, 1)")) << bad << ": " << m;
  }
  // A single ti2v checkpoint (the dense 5B) needs no boundary.
  TempDir single("wd-experts");
  write_random_wan_checkpoint(single.str(), tiny("ti2v"), torch::kFloat, 1ULL << 30, 1);
  EXPECT_EQ(WanExperts::open(single.str()).size(), 1u);
}

TEST(WanExpertsOpen, ArchitectureMismatchNamesBothConfigsAndEveryField) {
  TempDir dir("wd-experts");
  auto high = tiny();
  high.dim = 64;
  high.num_layers = 2;
  write_random_wan_checkpoint(dir.str(WanExperts::kLowDir), tiny(), torch::kFloat, 1ULL << 30, 1);
  write_random_wan_checkpoint(dir.str(WanExperts::kHighDir), high, torch::kFloat, 1ULL << 30, 2);
  const auto msg = error_of([&] { WanExperts::open(dir.str()); });
  EXPECT_TRUE(contains(msg, dir.str("low_noise_model/config.json"))) << msg;
  EXPECT_TRUE(contains(msg, dir.str("high_noise_model/config.json"))) << msg;
  EXPECT_TRUE(contains(msg, "differ in 2 field(s) (low vs high)")) << msg;
  EXPECT_TRUE(contains(msg, "dim 128 vs 64")) << msg;
  EXPECT_TRUE(contains(msg, "num_layers 4 vs 2")) << msg;
  EXPECT_FALSE(contains(msg, "ffn_dim")) << msg;
  EXPECT_THROW(WanExperts::open(dir.str()), DataError);
}

TEST(WanExpertsOpen, MissingSubfolderAndOneExpertOpenedWhole) {
  TempDir dir("wd-experts");
  write_random_wan_checkpoint(dir.str(WanExperts::kHighDir), tiny(), torch::kFloat, 1ULL << 30, 1);
  EXPECT_TRUE(WanExperts::is_two_expert_dir(dir.str()));
  const auto msg = error_of([&] { WanExperts::open(dir.str()); });
  EXPECT_TRUE(contains(msg, dir.str() + ": low_noise_model: is missing")) << msg;
  EXPECT_TRUE(contains(msg, "found only high_noise_model/")) << msg;
  // WanCheckpoint is one expert: the top folder is refused with a pointer to WanExperts.
  const auto ck_msg = error_of([&] { WanCheckpoint::open(dir.str()); });
  EXPECT_TRUE(contains(ck_msg, "two-expert (A14B) checkpoint: open it with WanExperts")) << ck_msg;
  // Each expert alone is an ordinary checkpoint.
  EXPECT_EQ(WanExperts::open(dir.str(WanExperts::kHighDir)).size(), 1u);
  // A config override makes no sense for two configs.
  write_random_wan_checkpoint(dir.str(WanExperts::kLowDir), tiny(), torch::kFloat, 1ULL << 30, 2);
  const auto cfg_msg = error_of(
      [&] { WanExperts::open(dir.str(), std::nullopt, dir.str("low_noise_model/config.json")); });
  EXPECT_TRUE(contains(cfg_msg, "cannot be used with the two-expert folder")) << cfg_msg;
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(WanExpertsOpen, DiffusersPipelineIsThePairWithItsBoundaryRatio) {
  TempDir dir("wd-experts");
  write_random_wan_experts(dir.str(), tiny(), torch::kFloat, 1ULL << 30, 7, KeyLayout::kDiffusers);
  const auto folders = WanExperts::folders(dir.str());
  ASSERT_TRUE(folders.has_value());
  EXPECT_EQ(folders->names[WanExperts::kLow], "transformer_2");
  EXPECT_EQ(folders->names[WanExperts::kHigh], "transformer");
  EXPECT_EQ(folders->boundary, std::optional<double>(0.875));
  const auto ex = WanExperts::open(dir.str());
  ASSERT_TRUE(ex.two_experts());
  EXPECT_EQ(ex.expert_name(WanExperts::kLow), "transformer_2");
  EXPECT_EQ(ex.expert_name(WanExperts::kHigh), "transformer");
  EXPECT_EQ(ex.expert(WanExperts::kLow).path(), dir.str("transformer_2"));
  EXPECT_EQ(ex.expert(WanExperts::kHigh).layout(), KeyLayout::kDiffusers);
  EXPECT_EQ(ex.config().summary(), tiny().summary());
  // transformer_2/ (low-noise) holds seed 7's weights, transformer/ (high-noise) seed 8's.
  const auto spec = wan_param_specs(ex.config()).back();
  const auto index = wan_param_specs(ex.config()).size() - 1;
  EXPECT_TRUE(torch::equal(ex.expert(WanExperts::kLow).tensor(spec.name),
                           wan_random_parameter(spec, index, 7, torch::kFloat)));
  EXPECT_TRUE(torch::equal(ex.expert(WanExperts::kHigh).tensor(spec.name),
                           wan_random_parameter(spec, index, 8, torch::kFloat)));

  // The file's boundary_ratio overrides the type's default; an explicit boundary overrides both.
  const auto model_index = dir.str(DiffusersPipeline::kIndexName);
  write_text(model_index, R"({"_class_name": "WanPipeline", "boundary_ratio": 0.9,
      "transformer": ["diffusers", "WanTransformer3DModel"],
      "transformer_2": ["diffusers", "WanTransformer3DModel"], "vae": ["diffusers", "AutoencoderKLWan"]})");
  EXPECT_EQ(WanExperts::open(dir.str()).boundary(), 0.9);
  EXPECT_EQ(WanExperts::open(dir.str(), 0.7).boundary(), 0.7);
  // WanCheckpoint is one expert.
  const auto ck_msg = error_of([&] { WanCheckpoint::open(dir.str()); });
  EXPECT_TRUE(contains(ck_msg, "two-expert (A14B) diffusers pipeline")) << ck_msg;
  EXPECT_TRUE(contains(ck_msg, "transformer/ (high-noise) or transformer_2/ (low-noise)")) << ck_msg;

  // A bad model_index.json is named with the field.
  write_text(model_index, R"({"transformer": ["diffusers", "FluxTransformer2DModel"]})");
  auto msg = error_of([&] { WanExperts::open(dir.str()); });
  EXPECT_TRUE(contains(msg, model_index + ": transformer: names FluxTransformer2DModel")) << msg;
  write_text(model_index, R"({"boundary_ratio": 1.5, "transformer": ["diffusers", "WanTransformer3DModel"],
      "transformer_2": ["diffusers", "WanTransformer3DModel"]})");
  msg = error_of([&] { WanExperts::open(dir.str()); });
  EXPECT_TRUE(contains(msg, "boundary_ratio: must be a number in (0, 1) or null, got 1.5")) << msg;
}

TEST(WanExpertsOpen, DiffusersPipelineWithOneTransformerIsOneModel) {
  TempDir dir("wd-experts");
  write_random_wan_checkpoint(dir.str(DiffusersPipeline::kTransformer), tiny("ti2v"), torch::kFloat,
                              1ULL << 30, 3, KeyLayout::kDiffusers);
  write_diffusers_model_index(dir.str(), tiny("ti2v"), false, std::nullopt);
  EXPECT_FALSE(WanExperts::is_two_expert_dir(dir.str()));
  const auto ex = WanExperts::open(dir.str());
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex.expert(0).path(), dir.str("transformer"));
  EXPECT_EQ(ex.config().model_type, "ti2v");  // kept in config.json's _wan_model_type
  const auto pipeline = DiffusersPipeline::read(dir.str());
  EXPECT_EQ(pipeline.class_name, "WanPipeline");
  EXPECT_FALSE(pipeline.two_experts);
  EXPECT_FALSE(pipeline.boundary_ratio.has_value());
}

TEST(WanExpertsCli, InitTeacherWritesADiffusersPipelineThatInspectReads) {
  TempDir dir("wd-experts");
  const auto out = dir.str("pipeline");
  auto r = test::run_command(kCli + " init-teacher --preset tiny --experts 2 --layout diffusers "
                                    "--dtype bf16 --output " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "wrote transformer_2/ (1 file(s), low-noise) and transformer/")) << r.output;
  r = test::run_command(kCli + " inspect " + out);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "experts:     2 (transformer_2, transformer)")) << r.output;
  EXPECT_TRUE(contains(r.output, "boundary 0.875 (boundary_ratio of model_index.json)")) << r.output;
  EXPECT_TRUE(contains(r.output, "transformer (high-noise):\n  path:        " + out + "/transformer\n"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "  format:      diffusers")) << r.output;
  EXPECT_TRUE(contains(r.output, "architecture: shared")) << r.output;
}

TEST(WanExpertsForward, MixedBatchEqualsEachExpertOnItsSamples) {
  TempDir dir("wd-experts");
  write_pair(dir, tiny(), 11);
  const auto ex = WanExperts::open(dir.str());
  auto models = load_wan_experts(ex, torch::kFloat);
  ASSERT_EQ(models.size(), 2u);
  torch::manual_seed(3);
  // Samples 0 and 1 have 8 tokens, 2 and 3 have 16: the high expert gets only small samples,
  // which must still be padded to the full batch's 16 tokens.
  WanInputs in;
  in.x = {torch::randn({16, 2, 4, 4}), torch::randn({16, 2, 4, 4}), torch::randn({16, 2, 8, 4}),
          torch::randn({16, 2, 8, 4})};
  in.context = {torch::randn({16, 64}), torch::randn({9, 64}), torch::randn({16, 64}),
                torch::randn({5, 64})};
  in.t = torch::tensor({950.f, 874.9f, 300.f, 875.f});
  const auto r = ex.route(in.t);
  ASSERT_EQ(r, routes({1, 2}, {0, 3}));

  torch::NoGradGuard no_grad;
  const auto out = experts_forward(models, ex, in);
  ASSERT_EQ(out.size(), 4u);
  const auto alone = [&](std::size_t e, std::vector<std::int64_t> samples) {
    WanInputs sub;
    for (const auto s : samples) {
      sub.x.push_back(in.x[s]);
      sub.context.push_back(in.context[s]);
    }
    std::vector<float> ts;
    for (const auto s : samples) ts.push_back(in.t[s].item<float>());
    sub.t = torch::tensor(ts);
    sub.seq_len = 16;
    return models[e]->forward(sub);
  };
  const auto low = alone(WanExperts::kLow, {1, 2});
  const auto high = alone(WanExperts::kHigh, {0, 3});
  EXPECT_TRUE(torch::equal(out[1], low[0]));
  EXPECT_TRUE(torch::equal(out[2], low[1]));
  EXPECT_TRUE(torch::equal(out[0], high[0]));
  EXPECT_TRUE(torch::equal(out[3], high[1]));
  EXPECT_EQ(out[2].sizes(), (std::vector<std::int64_t>{16, 2, 8, 4}));
  // The experts really differ, so a swapped route would be caught.
  const auto other = alone(WanExperts::kLow, {0});
  EXPECT_GT((other[0] - out[0]).abs().max().item<float>(), 1e-3);
  // A one-sample run without extra padding agrees within rounding (batch independence).
  WanInputs one{{in.x[0]}, {}, in.t.slice(0, 0, 1), {in.context[0]}, 0};
  EXPECT_LE((models[WanExperts::kHigh]->forward(one)[0] - out[0]).abs().max().item<float>(), 1e-5);
}

TEST(WanExpertsForward, SelectSamplesKeepsSeqLenAndTimestepRows) {
  WanInputs in;
  in.x = {torch::zeros({16, 1, 2, 2}), torch::zeros({16, 2, 4, 4}), torch::zeros({16, 1, 2, 4})};
  in.context = {torch::zeros({3, 8}), torch::ones({4, 8}), torch::full({5, 8}, 2.f)};
  in.t = torch::tensor({{1.f, 1.f}, {2.f, 2.f}, {3.f, 3.f}});
  const auto sub = select_samples(in, {2, 0}, {1, 2, 2});
  EXPECT_EQ(sub.seq_len, 8);  // sample 1: 2·2·2 tokens, the largest of the full batch
  ASSERT_EQ(sub.x.size(), 2u);
  EXPECT_EQ(sub.x[0].sizes(), in.x[2].sizes());
  EXPECT_EQ(sub.context[0].size(0), 5);
  EXPECT_TRUE(torch::equal(sub.t, torch::tensor({{3.f, 3.f}, {1.f, 1.f}})));
  in.seq_len = 20;
  EXPECT_EQ(select_samples(in, {0}, {1, 2, 2}).seq_len, 20);
  EXPECT_TRUE(contains(error_of([&] {
                         select_samples(in, {3}, {1, 2, 2});
                       }),
                       "sample index 3 is outside the batch of 3"));
}

TEST(WanExpertsForward, MergePutsOutputsBackInBatchOrder) {
  const auto merged = merge_expert_batches(
      routes({1, 3}, {0, 2}), {torch::tensor({{10.f}, {30.f}}), torch::tensor({{0.f}, {20.f}})}, 4);
  EXPECT_TRUE(torch::equal(merged, torch::tensor({{0.f}, {10.f}, {20.f}, {30.f}})));
  // An expert without samples may give nothing.
  EXPECT_TRUE(torch::equal(
      merge_expert_batches(routes({}, {0, 1}), {torch::Tensor(), torch::tensor({5.f, 6.f})}, 2),
      torch::tensor({5.f, 6.f})));
  const auto list = merge_expert_outputs(
      routes({2}, {0, 1}), {{torch::tensor(2.f)}, {torch::tensor(0.f), torch::tensor(1.f)}}, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(list[i].item<float>(), static_cast<float>(i));
  EXPECT_TRUE(contains(error_of([] {
                         merge_expert_outputs(
                             routes({0, 1}, {1}),
                             {{torch::tensor(0.f), torch::tensor(1.f)}, {torch::tensor(2.f)}}, 2);
                       }),
                       "sample 1 is routed to more than one expert"));
  EXPECT_TRUE(contains(error_of([] {
                         merge_expert_outputs(routes({0}, {}), {{torch::tensor(0.f)}, {}}, 2);
                       }),
                       "sample 1 is routed to no expert"));
}

TEST(WanExpertsCli, InitTeacherWritesTwoExpertsThatOpenAndInspect) {
  TempDir dir("wd-experts");
  const auto out = dir.str("a14b");
  auto r = test::run_command(
      kCli + " init-teacher --preset tiny --experts 2 --dtype fp32 --seed 7 --output " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto ex = WanExperts::open(out);
  ASSERT_TRUE(ex.two_experts());
  EXPECT_EQ(ex.boundary(), 0.875);
  EXPECT_EQ(ex.expert_name(WanExperts::kHigh), "high_noise_model");
  EXPECT_TRUE(ex.expert(WanExperts::kLow).problems().empty());
  EXPECT_TRUE(ex.expert(WanExperts::kHigh).problems().empty());
  // low_noise_model/ holds seed 7's weights, high_noise_model/ seed 8's.
  const auto specs = wan_param_specs(ex.config());
  const auto& spec = specs.front();
  EXPECT_TRUE(torch::equal(ex.expert(WanExperts::kLow).tensor(spec.name),
                           wan_random_parameter(spec, 0, 7, torch::kFloat)));
  EXPECT_TRUE(torch::equal(ex.expert(WanExperts::kHigh).tensor(spec.name),
                           wan_random_parameter(spec, 0, 8, torch::kFloat)));

  r = test::run_command(kCli + " inspect " + out);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "experts:     2 (low_noise_model, high_noise_model)")) << r.output;
  EXPECT_TRUE(contains(r.output, "boundary 0.875 (default of t2v)")) << r.output;
  EXPECT_TRUE(contains(r.output, "architecture: shared")) << r.output;
  EXPECT_TRUE(contains(r.output, "  config:      " + out + "/high_noise_model/config.json"))
      << r.output;

  r = test::run_command(kCli + " plan --cpu --teacher.checkpoint " + out);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "teacher " + out + ": 2 experts of t2v dim 128")) << r.output;

  // An existing folder is not overwritten silently; --experts takes 1 or 2.
  r = test::run_command(kCli + " init-teacher --preset tiny --experts 2 --output " + out);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--overwrite")) << r.output;
  r = test::run_command(kCli + " init-teacher --preset tiny --experts 3 --output " + dir.str("x"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "experts(3) must be 1 or 2")) << r.output;
}

}  // namespace
}  // namespace wd::test_experts
