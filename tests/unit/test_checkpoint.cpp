// WanCheckpoint: layouts (native, diffusers, ComfyUI prefix), sharding, and error reporting.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/errors.hpp"
#include "model/wan_checkpoint.hpp"
#include "test_util.hpp"

namespace wd::test_checkpoint {
namespace {

namespace fs = std::filesystem;
const std::string kFixtures = WD_FIXTURES;
const std::string kTinyA = kFixtures + "/wan-tiny-a";

using test::TempDir;

TensorMap golden_weights(const std::function<std::string(const std::string&)>& rename) {
  auto f = SafetensorsFile::open(kTinyA + "/weights.safetensors");
  TensorMap m;
  for (const auto& t : f.tensors()) m[rename(t.name)] = f.tensor(t.name);
  return m;
}

torch::Tensor run(const WanCheckpoint& ck) {
  auto model = load_wan_dit(ck, torch::kFloat);
  auto in = SafetensorsFile::open(kTinyA + "/inputs.safetensors");
  torch::NoGradGuard no_grad;
  return torch::stack(model->forward(WanInputs::batched(in.tensor("x"), in.tensor("t_tokens"),
                                                        in.tensor("context"))));
}

TEST(KeyMapping, EveryNativeKeyRoundTripsThroughDiffusers) {
  const auto specs = wan_param_specs(WanConfig::preset("wan22-t2v-a14b"));
  for (const auto& s : specs) {
    const auto d = native_to_diffusers(s.name);
    EXPECT_TRUE(looks_like_diffusers(d) || d.rfind("patch_embedding.", 0) == 0) << d;
    ASSERT_TRUE(diffusers_to_native(d).has_value()) << d;
    EXPECT_EQ(*diffusers_to_native(d), s.name);
  }
  EXPECT_EQ(native_to_diffusers("blocks.3.norm3.weight"), "blocks.3.norm2.weight");
  EXPECT_EQ(native_to_diffusers("blocks.3.self_attn.o.bias"), "blocks.3.attn1.to_out.0.bias");
  EXPECT_EQ(native_to_diffusers("blocks.0.ffn.0.weight"), "blocks.0.ffn.net.0.proj.weight");
  EXPECT_EQ(native_to_diffusers("head.modulation"), "scale_shift_table");
  EXPECT_EQ(native_to_diffusers("blocks.7.modulation"), "blocks.7.scale_shift_table");
  EXPECT_EQ(native_to_diffusers("time_projection.1.weight"), "condition_embedder.time_proj.weight");
  EXPECT_FALSE(diffusers_to_native("blocks.0.attn1.add_k_proj.weight").has_value());
}

TEST(WanCheckpointTest, DiffusersAndComfyLayoutsLoadToTheSameModel) {
  const auto native = run(WanCheckpoint::open(kTinyA + "/weights.safetensors"));
  TempDir diff, comfy;
  write_safetensors(diff.str("model.safetensors"), golden_weights(native_to_diffusers));
  fs::copy_file(kTinyA + "/config.json", diff.str("config.json"));
  auto dck = WanCheckpoint::open(diff.str());
  EXPECT_EQ(dck.layout(), KeyLayout::kDiffusers);
  EXPECT_TRUE(dck.problems().empty());
  EXPECT_EQ((run(dck) - native).abs().max().item<float>(), 0.f);

  write_safetensors(comfy.str("wan.safetensors"),
                    golden_weights([](const std::string& k) { return "model.diffusion_model." + k; }));
  auto cck = WanCheckpoint::open(comfy.str("wan.safetensors"), kTinyA + "/config.json");
  EXPECT_TRUE(cck.prefixed());
  EXPECT_EQ((run(cck) - native).abs().max().item<float>(), 0.f);
}

TEST(WanCheckpointTest, RandomCheckpointIsShardedWithIndexAndLoadsInBothLayouts) {
  TempDir a, b;
  auto config = WanConfig::preset("tiny");
  const auto ra = write_random_wan_checkpoint(a.str(), config, torch::kFloat, 600'000, 5);
  EXPECT_GT(ra.shard_files.size(), 2u);
  EXPECT_EQ(ra.shard_files.front(), "diffusion_pytorch_model-00001-of-0000" +
                                        std::to_string(ra.shard_files.size()) + ".safetensors");
  write_random_wan_checkpoint(b.str(), config, torch::kFloat, 1'000'000'000, 5, KeyLayout::kDiffusers);
  auto ca = WanCheckpoint::open(a.str());
  auto cb = WanCheckpoint::open(b.str());
  EXPECT_EQ(ca.files().size(), ra.shard_files.size());
  EXPECT_EQ(cb.layout(), KeyLayout::kDiffusers);
  EXPECT_EQ(ca.total_bytes(), ra.total_bytes);
  // Same seed, other key names: identical tensors under the native names.
  for (const auto& s : wan_param_specs(config)) {
    ASSERT_TRUE(torch::equal(ca.tensor(s.name), cb.tensor(s.name))) << s.name;
  }
}

TEST(WanCheckpointTest, LoadIsZeroCopyWhenDtypeMatches) {
  auto ck = WanCheckpoint::open(kTinyA + "/weights.safetensors");
  auto model = load_wan_dit(ck);
  const auto& file = ck.files().front();
  const auto* base = static_cast<const std::uint8_t*>(file.tensor(file.tensors().front().name).data_ptr());
  for (const auto& p : model->named_parameters()) {
    const auto* ptr = static_cast<const std::uint8_t*>(p.value().data_ptr());
    EXPECT_TRUE(ptr >= base - 1'000'000 && ptr < base + file.data_bytes()) << p.key();
    EXPECT_FALSE(p.value().requires_grad());
  }
}

TEST(WanCheckpointTest, AllProblemsAreReportedAtOnceByName) {
  TempDir d;
  auto m = golden_weights([](const std::string& k) { return k; });
  m.erase("blocks.1.ffn.2.bias");
  m.erase("head.modulation");
  m["blocks.0.self_attn.q.weight"] = torch::zeros({64, 63});
  m["blocks.0.extra.weight"] = torch::zeros({2});
  write_safetensors(d.str("w.safetensors"), m);
  auto ck = WanCheckpoint::open(d.str("w.safetensors"), kTinyA + "/config.json");
  EXPECT_EQ(ck.problems().size(), 4u);
  try {
    load_wan_dit(ck);
    FAIL() << "loaded a broken checkpoint";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    for (const char* part : {"missing blocks.1.ffn.2.bias [64]", "missing head.modulation [1,2,64]",
                             "mis-shaped blocks.0.self_attn.q.weight: [64,63]",
                             "expects [64,64]", "unexpected blocks.0.extra.weight"}) {
      EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg;
    }
  }
}

TEST(WanCheckpointTest, BadDirectoriesAndIndexesGiveClearErrors) {
  TempDir d;
  EXPECT_THROW(WanCheckpoint::open(d.str("nope")), DataError);
  // Many files and no index: ambiguous.
  try {
    WanCheckpoint::open(kTinyA);
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("expected an index or exactly one file"), std::string::npos);
  }
  // Index naming a shard that is not there.
  const auto written =
      write_random_wan_checkpoint(d.str(), WanConfig::preset("tiny"), torch::kBFloat16, 500'000, 1);
  ASSERT_GE(written.shard_files.size(), 2u);
  fs::remove(d.str(written.shard_files[1]));
  try {
    WanCheckpoint::open(d.str());
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(written.shard_files[1] + ", which does not exist"),
              std::string::npos) << e.what();
  }
  // A file without a config beside it.
  TempDir lone;
  fs::copy_file(kTinyA + "/weights.safetensors", lone.str("w.safetensors"));
  try {
    WanCheckpoint::open(lone.str("w.safetensors"));
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("--model-config"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace wd::test_checkpoint
