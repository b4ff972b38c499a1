// convert_wan_checkpoint: bit-exact dtype conversion with the fp32 islands, every input layout,
// sharding, atomic publication, refusals, and the converted model's forward.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/errors.hpp"
#include "model/diffusers_pipeline.hpp"
#include "model/wan_convert.hpp"
#include "test_util.hpp"

namespace wd::test_convert {
namespace {

namespace fs = std::filesystem;
const std::string kTinyA = std::string(WD_FIXTURES) + "/wan-tiny-a";
const std::string kTinyAWeights = kTinyA + "/weights.safetensors";

using test::TempDir;

/// The tensor's bytes as integers, so that equality is bit equality (also for -0 and NaN).
torch::Tensor bits(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat:
      return t.contiguous().view(torch::kInt);
    case torch::kBFloat16:
    case torch::kHalf:
      return t.contiguous().view(torch::kShort);
    default:
      ADD_FAILURE() << "unexpected dtype " << t.scalar_type();
      return t;
  }
}

/// Every tensor of `out` is `in`'s cast to `dtype` bit for bit, or `in`'s own bits when the
/// precision rule kept it fp32 (and `keep_fp32` is on); `out` has `layout`'s key names.
void expect_converted(const WanCheckpoint& in, const WanCheckpoint& out, c10::ScalarType dtype,
                      bool keep_fp32, KeyLayout layout = KeyLayout::kNative) {
  ASSERT_TRUE(out.problems().empty());
  EXPECT_EQ(out.layout(), layout);
  EXPECT_FALSE(out.prefixed());
  EXPECT_EQ(out.config().summary(), in.config().summary());
  for (const auto& spec : wan_param_specs(in.config())) {
    const auto original = in.tensor(spec.name);
    const auto got = out.tensor(spec.name);
    const bool kept = keep_fp32 && original.scalar_type() == torch::kFloat && kept_in_fp32(spec.name);
    const auto want = kept ? original : original.to(dtype);
    ASSERT_EQ(got.scalar_type(), want.scalar_type()) << spec.name;
    EXPECT_TRUE(torch::equal(bits(got), bits(want))) << spec.name;
  }
}

TEST(KeptInFp32, FollowsTheFp32IslandsOfTheSpec) {
  for (const char* k : {"time_embedding.0.weight", "time_embedding.2.bias", "time_projection.1.weight",
                        "blocks.0.modulation", "blocks.39.modulation", "blocks.3.norm3.weight",
                        "blocks.3.norm3.bias", "head.modulation", "head.head.weight", "head.head.bias"}) {
    EXPECT_TRUE(kept_in_fp32(k)) << k;
  }
  for (const char* k : {"patch_embedding.weight", "text_embedding.0.weight", "blocks.0.self_attn.q.weight",
                        "blocks.0.self_attn.norm_q.weight", "blocks.0.cross_attn.o.bias",
                        "blocks.0.ffn.0.weight", "blocks.1.ffn.2.bias"}) {
    EXPECT_FALSE(kept_in_fp32(k)) << k;
  }
}

TEST(Convert, Fp32ToBf16IsBitExactAndKeepsTheIslandsFp32) {
  TempDir d;
  const auto in = WanCheckpoint::open(kTinyAWeights);
  const auto result = convert_wan_checkpoint(in, d.str("bf16"), ConvertOptions{});
  // 2 blocks: time_embedding (4) + time_projection (2) + head (3) + per block modulation + norm3 (3).
  EXPECT_EQ(result.kept_fp32, 4u + 2u + 3u + 2u * 3u);
  EXPECT_EQ(result.tensors, wan_param_specs(in.config()).size());
  EXPECT_TRUE(fs::exists(d.path() / "bf16" / "config.json"));
  EXPECT_TRUE(fs::exists(d.path() / "bf16" / "diffusion_pytorch_model.safetensors"));
  const auto out = WanCheckpoint::open(d.str("bf16"));
  expect_converted(in, out, torch::kBFloat16, true);
  EXPECT_EQ(out.dtype_summary().at("F32").first, result.kept_fp32);
  // Nothing but the output itself is left in the parent directory.
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path()), fs::directory_iterator{}), 1);
}

TEST(Convert, WithoutKeepFp32EverythingIsTheTargetDtype) {
  TempDir d;
  const auto in = WanCheckpoint::open(kTinyAWeights);
  ConvertOptions options;
  options.dtype = torch::kHalf;
  options.keep_fp32 = false;
  const auto result = convert_wan_checkpoint(in, d.str("fp16"), options);
  EXPECT_EQ(result.kept_fp32, 0u);
  const auto out = WanCheckpoint::open(d.str("fp16"));
  expect_converted(in, out, torch::kHalf, false);
  EXPECT_EQ(out.dtype_summary().size(), 1u);
}

TEST(Convert, DiffusersAndComfyPrefixedInputsBecomeNative) {
  TempDir d;
  const auto config = WanConfig::preset("tiny");
  write_random_wan_checkpoint(d.str("diffusers"), config, torch::kFloat, 1'000'000, 7, KeyLayout::kDiffusers);
  const auto diffusers = WanCheckpoint::open(d.str("diffusers"));
  ASSERT_EQ(diffusers.layout(), KeyLayout::kDiffusers);
  convert_wan_checkpoint(diffusers, d.str("from-diffusers"), ConvertOptions{});
  expect_converted(diffusers, WanCheckpoint::open(d.str("from-diffusers")), torch::kBFloat16, true);

  // ComfyUI repackaging: native names under model.diffusion_model., one file.
  const auto golden = SafetensorsFile::open(kTinyAWeights);
  TensorMap prefixed;
  for (const auto& t : golden.tensors()) prefixed["model.diffusion_model." + t.name] = golden.tensor(t.name);
  fs::create_directories(d.path() / "comfy");
  write_safetensors(d.str("comfy/wan.safetensors"), prefixed);
  fs::copy_file(kTinyA + "/config.json", d.str("comfy/config.json"));
  const auto comfy = WanCheckpoint::open(d.str("comfy"));
  ASSERT_TRUE(comfy.prefixed());
  convert_wan_checkpoint(comfy, d.str("from-comfy"), ConvertOptions{});
  expect_converted(comfy, WanCheckpoint::open(d.str("from-comfy")), torch::kBFloat16, true);
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(Convert, DiffusersLayoutWritesDiffusersNamesAndConfigThatReadBack) {
  TempDir d;
  const auto in = WanCheckpoint::open(kTinyAWeights);
  ConvertOptions options;
  options.layout = KeyLayout::kDiffusers;
  options.shard_bytes = 50'000;
  const auto result = convert_wan_checkpoint(in, d.str("diffusers"), options);
  EXPECT_GT(result.files.shard_files.size(), 1u);
  const auto out = WanCheckpoint::open(d.str("diffusers"));
  expect_converted(in, out, torch::kBFloat16, true, KeyLayout::kDiffusers);
  for (const auto& f : out.files()) {
    for (const auto& t : f.tensors()) {
      EXPECT_TRUE(looks_like_diffusers(t.name) || t.name.rfind("patch_embedding.", 0) == 0) << t.name;
    }
  }
  // diffusers' field names, and the two native fields diffusers lacks as private fields.
  const auto config = read_text(d.path() / "diffusers" / "config.json");
  for (const char* field : {R"("_class_name": "WanTransformer3DModel")", R"("num_attention_heads": 4)",
                            R"("attention_head_dim": 16)", R"("qk_norm": "rms_norm_across_heads")",
                            R"("rope_max_seq_len": 1024)", R"("_wan_text_len": 8)", R"("_wan_model_type": "t2v")"}) {
    EXPECT_TRUE(test::contains(config, field)) << field << "\n" << config;
  }
  EXPECT_FALSE(test::contains(config, R"("dim")")) << config;

  // And back to native, bit for bit (fp32 -> fp32 keeps every bit).
  options.layout = KeyLayout::kNative;
  options.dtype = torch::kFloat;
  convert_wan_checkpoint(out, d.str("native"), options);
  expect_converted(out, WanCheckpoint::open(d.str("native")), torch::kFloat, true);
}

TEST(Convert, DiffusersLayoutRefusesAModelDiffusersCannotExpressBeforeWriting) {
  TempDir d;
  auto config = WanConfig::preset("tiny");
  config.qk_norm = false;
  write_random_wan_checkpoint(d.str("in"), config, torch::kFloat, 1'000'000, 3);
  ConvertOptions options;
  options.layout = KeyLayout::kDiffusers;
  try {
    convert_wan_checkpoint(WanCheckpoint::open(d.str("in")), d.str("out"), options);
    FAIL() << "qk_norm false was written as diffusers";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(test::contains(e.what(), "qk_norm(false)")) << e.what();
  }
  EXPECT_FALSE(fs::exists(d.path() / "out"));
}

// --layout pipeline: the DiT in transformer/ beside model_index.json, whose class and
// expand_timesteps are what diffusers samples each model type with (Wan 2.2's own folders:
// WanImageToVideoPipeline for I2V, WanPipeline with expand_timesteps for TI2V-5B).
TEST(Convert, PipelineLayoutWritesTheTransformerAndAModelIndexForEachModelType) {
  TempDir d;
  struct Case {
    const char* model_type;
    std::int64_t in_dim;
    const char* class_name;
    const char* expand_timesteps;
  };
  for (const auto& c : {Case{"t2v", 16, "WanPipeline", "false"}, Case{"i2v", 36, "WanImageToVideoPipeline", "false"},
                        Case{"ti2v", 16, "WanPipeline", "true"}}) {
    auto config = WanConfig::preset("tiny");
    config.model_type = c.model_type;
    config.in_dim = c.in_dim;
    const auto source = d.str(std::string("in-") + c.model_type), output = d.str(std::string("out-") + c.model_type);
    write_random_wan_checkpoint(source, config, torch::kFloat, 1'000'000, 5);
    const auto in = WanCheckpoint::open(source);
    ConvertOptions options;
    options.layout = KeyLayout::kDiffusers;
    options.pipeline = true;
    convert_wan_checkpoint(in, output, options);
    const auto index = read_text(fs::path(output) / "model_index.json");
    for (const auto& field : {std::string(R"("_class_name": ")") + c.class_name + "\"",
                              std::string(R"("expand_timesteps": )") + c.expand_timesteps,
                              std::string(R"("boundary_ratio": null)"),
                              std::string("\"transformer\": [\n    \"diffusers\",\n    \"WanTransformer3DModel\"\n  ]"),
                              std::string("\"transformer_2\": [\n    null,\n    null\n  ]")}) {
      EXPECT_TRUE(test::contains(index, field)) << c.model_type << ": " << field << "\n" << index;
    }
    const auto pipeline = DiffusersPipeline::read(output);
    EXPECT_EQ(pipeline.class_name, c.class_name);
    EXPECT_FALSE(pipeline.two_experts);
    EXPECT_TRUE(fs::exists(fs::path(output) / "transformer" / "config.json")) << c.model_type;
    EXPECT_FALSE(fs::exists(fs::path(output) / "config.json")) << c.model_type;
    // The folder reads back as its transformer, bit for bit in bf16, fp32 islands kept.
    const auto out = WanCheckpoint::open(output);
    expect_converted(in, out, torch::kBFloat16, true, KeyLayout::kDiffusers);
    EXPECT_EQ(out.config().model_type, c.model_type);
  }
  // A pipeline folder holds diffusers names only: asked with the native layout, nothing is written.
  ConvertOptions native;
  native.pipeline = true;
  try {
    convert_wan_checkpoint(WanCheckpoint::open(kTinyAWeights), d.str("native-pipeline"), native);
    FAIL() << "a pipeline was written in the native layout";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(test::contains(e.what(), "not native")) << e.what();
  }
  EXPECT_FALSE(fs::exists(d.path() / "native-pipeline"));
}

TEST(Convert, TinyShardSizeWritesSeveralShardsAndAnIndexThatLoad) {
  TempDir d;
  write_random_wan_checkpoint(d.str("in"), WanConfig::preset("tiny"), torch::kFloat, 1'000'000, 3);
  const auto in = WanCheckpoint::open(d.str("in"));
  ConvertOptions options;
  options.shard_bytes = 200'000;
  const auto result = convert_wan_checkpoint(in, d.str("out"), options);
  ASSERT_GE(result.files.shard_files.size(), 3u);
  EXPECT_EQ(result.files.index_file, "diffusion_pytorch_model.safetensors.index.json");
  const auto out = WanCheckpoint::open(d.str("out"));
  EXPECT_EQ(out.files().size(), result.files.shard_files.size());
  for (const auto& f : out.files()) {
    // Only a tensor larger than the limit on its own may exceed it.
    EXPECT_TRUE(f.data_bytes() <= options.shard_bytes || f.tensors().size() == 1) << f.path();
  }
  expect_converted(in, out, torch::kBFloat16, true);
  EXPECT_NO_THROW(load_wan_dit(out));
}

TEST(Convert, RefusesAnExistingOutputAndReplacesItWithForce) {
  TempDir d;
  const auto in = WanCheckpoint::open(kTinyAWeights);
  fs::create_directories(d.path() / "out");
  { std::ofstream(d.path() / "out" / "keep-me") << "x"; }
  try {
    convert_wan_checkpoint(in, d.str("out"), ConvertOptions{});
    FAIL() << "an existing output was accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(test::contains(e.what(), "--force")) << e.what();
  }
  EXPECT_TRUE(fs::exists(d.path() / "out" / "keep-me"));
  ConvertOptions force;
  force.force = true;
  convert_wan_checkpoint(in, d.str("out"), force);
  EXPECT_FALSE(fs::exists(d.path() / "out" / "keep-me"));
  expect_converted(in, WanCheckpoint::open(d.str("out")), torch::kBFloat16, true);
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path()), fs::directory_iterator{}), 1);

  // Never over the input, not even with --force.
  write_random_wan_checkpoint(d.str("self"), WanConfig::preset("tiny"), torch::kFloat, 1'000'000, 3);
  EXPECT_THROW(convert_wan_checkpoint(WanCheckpoint::open(d.str("self")), d.str("self"), force), ConfigError);
  EXPECT_TRUE(fs::exists(d.path() / "self" / "config.json"));
}

TEST(Convert, AFailureNamesTheTensorAndLeavesNothingBehind) {
  TempDir d;
  auto golden = SafetensorsFile::open(kTinyAWeights);
  TensorMap weights;
  for (const auto& t : golden.tensors()) weights[t.name] = golden.tensor(t.name);
  weights["blocks.1.ffn.0.weight"] = weights["blocks.1.ffn.0.weight"] * 1e6f;  // beyond fp16
  fs::create_directories(d.path() / "in");
  write_safetensors(d.str("in/w.safetensors"), weights);
  fs::copy_file(kTinyA + "/config.json", d.str("in/config.json"));
  ConvertOptions options;
  options.dtype = torch::kHalf;
  options.shard_bytes = 50'000;  // some shards are already written when the bad tensor comes
  try {
    convert_wan_checkpoint(WanCheckpoint::open(d.str("in")), d.str("out"), options);
    FAIL() << "an overflowing conversion was accepted";
  } catch (const DataError& e) {
    EXPECT_TRUE(test::contains(e.what(), "blocks.1.ffn.0.weight")) << e.what();
    EXPECT_TRUE(test::contains(e.what(), d.str("in/w.safetensors"))) << e.what();
    EXPECT_TRUE(test::contains(e.what(), "fp16")) << e.what();
  }
  EXPECT_FALSE(fs::exists(d.path() / "out"));
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path()), fs::directory_iterator{}), 1);

  // An incomplete checkpoint is refused before anything is written, with every problem listed.
  weights.erase("head.modulation");
  write_safetensors(d.str("in/w.safetensors"), weights);
  try {
    convert_wan_checkpoint(WanCheckpoint::open(d.str("in")), d.str("out"), ConvertOptions{});
    FAIL();
  } catch (const DataError& e) {
    EXPECT_TRUE(test::contains(e.what(), "missing head.modulation")) << e.what();
  }
  EXPECT_FALSE(fs::exists(d.path() / "out"));
}

double rel_error(const torch::Tensor& got, const torch::Tensor& want) {
  auto w = want.to(torch::kDouble);
  return (got.to(torch::kDouble) - w).norm().item<double>() / w.norm().item<double>();
}

torch::Tensor forward(WanDiT model) {
  auto in = SafetensorsFile::open(kTinyA + "/inputs.safetensors");
  torch::NoGradGuard no_grad;
  return torch::stack(model->forward(WanInputs::batched(in.tensor("x"), in.tensor("t_tokens"),
                                                        in.tensor("context"), in.tensor("context_lens"),
                                                        in.tensor("seq_len").item<std::int64_t>())));
}

// The tolerance is the one documented for bf16 compute (test_wan_dit: 1e-2 relative).
TEST(Convert, ConvertedForwardMatchesTheOriginalWithinBf16Tolerance) {
  TempDir d;
  const auto in = WanCheckpoint::open(kTinyAWeights);
  const auto reference = forward(load_wan_dit(in, torch::kFloat));
  convert_wan_checkpoint(in, d.str("mixed"), ConvertOptions{});
  ConvertOptions all_bf16;
  all_bf16.keep_fp32 = false;
  convert_wan_checkpoint(in, d.str("bf16"), all_bf16);

  // Loaded as stored: bf16 matmuls, fp32 islands bound zero-copy in fp32.
  auto mixed = load_wan_dit(WanCheckpoint::open(d.str("mixed")));
  EXPECT_EQ(mixed->dtype(), torch::kBFloat16);
  EXPECT_EQ(mixed->named_parameters()["blocks.0.modulation"].scalar_type(), torch::kFloat);
  EXPECT_EQ(mixed->named_parameters()["blocks.0.ffn.0.weight"].scalar_type(), torch::kBFloat16);
  const double rel_mixed = rel_error(forward(mixed), reference);
  const double rel_bf16 = rel_error(forward(load_wan_dit(WanCheckpoint::open(d.str("bf16")))), reference);
  // Loaded as the teacher does (explicit bf16): islands converted at load, same tolerance.
  const double rel_teacher =
      rel_error(forward(load_wan_dit(WanCheckpoint::open(d.str("mixed")), torch::kBFloat16)), reference);
  std::printf("  converted forward vs fp32 original: keep-fp32 %.3g, all bf16 %.3g, "
              "loaded as bf16 %.3g (tolerance 1e-2)\n", rel_mixed, rel_bf16, rel_teacher);
  EXPECT_LE(rel_mixed, 1e-2);
  EXPECT_LE(rel_bf16, 1e-2);
  EXPECT_LE(rel_teacher, 1e-2);
  EXPECT_GT(rel_mixed, 0.0);  // really bf16
}

}  // namespace
}  // namespace wd::test_convert
