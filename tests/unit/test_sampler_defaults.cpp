// The official Wan 2.2 samplers' table and the defaults `sample` and `evaluate` take from it: a
// teacher shaped as T2V-A14B, I2V-A14B or TI2V-5B gets that model's steps, shift and guidance for
// the keys left unset; explicit keys and teachers of no official shape keep their values.
#include <gtest/gtest.h>

#include "eval/sampler_defaults.hpp"
#include "model/official_samplers.hpp"
#include "model/wan_experts.hpp"
#include "test_util.hpp"

namespace wd::test_sampler_defaults {
namespace {

using test::TempDir;

WanConfig tiny(const std::string& model_type) {
  auto c = WanConfig::preset("tiny");
  c.model_type = model_type;
  if (model_type == "i2v") c.in_dim = 36;  // 16 noisy + 4 mask + 16 image latent
  return c;
}

/// A random tiny teacher of `model_type` with `experts` experts, opened.
WanExperts teacher(const TempDir& dir, const std::string& model_type, std::size_t experts) {
  if (experts == 2) {
    write_random_wan_experts(dir.str(), tiny(model_type), torch::kFloat, 1ULL << 30, 3);
  } else {
    write_random_wan_checkpoint(dir.str(), tiny(model_type), torch::kFloat, 1ULL << 30, 3);
  }
  return WanExperts::open(dir.str());
}

/// evaluate's three keys at values no official sampler has.
struct Keys {
  std::int64_t steps = 7;
  double shift = 1.5;
  GuidanceScale guidance = 2.0;
  eval::SamplerKeys bind() {
    return {"evaluate", "teacher.steps", &steps, "teacher.shift", &shift, "teacher.guidance", &guidance};
  }
};

TEST(OfficialSamplers, TheTableHoldsWan22sConfigs) {
  // wan/configs/wan_t2v_A14B.py, wan_i2v_A14B.py, wan_ti2v_5B.py of Wan-Video/Wan2.2.
  const auto* t2v = official_sampler("t2v", 2);
  ASSERT_NE(t2v, nullptr);
  EXPECT_STREQ(t2v->name, "T2V-A14B");
  EXPECT_EQ(t2v->shift, 12.0);
  EXPECT_EQ(t2v->steps, 40);
  EXPECT_EQ(t2v->guidance.low, 3.0);
  EXPECT_EQ(t2v->guidance.high, 4.0);
  EXPECT_EQ(t2v->boundary, std::optional<double>(0.875));
  const auto* i2v = official_sampler("i2v", 2);
  ASSERT_NE(i2v, nullptr);
  EXPECT_EQ(i2v->shift, 5.0);
  EXPECT_EQ(i2v->steps, 40);
  EXPECT_EQ(i2v->guidance.str(), "3.5");
  EXPECT_EQ(i2v->boundary, std::optional<double>(0.9));
  const auto* ti2v = official_sampler("ti2v", 1);
  ASSERT_NE(ti2v, nullptr);
  EXPECT_EQ(ti2v->shift, 5.0);
  EXPECT_EQ(ti2v->steps, 50);
  EXPECT_EQ(ti2v->guidance.str(), "5");
  EXPECT_FALSE(ti2v->boundary.has_value());
  EXPECT_EQ(describe(*ti2v), "TI2V-5B (model_type ti2v, one model)");
  // Other shapes are no official model: one t2v or i2v model (Wan 2.1-like, the tiny teachers), a ti2v pair.
  EXPECT_EQ(official_sampler("t2v", 1), nullptr);
  EXPECT_EQ(official_sampler("i2v", 1), nullptr);
  EXPECT_EQ(official_sampler("ti2v", 2), nullptr);
  // The expert boundary reads the same table.
  EXPECT_EQ(default_expert_boundary("t2v"), std::optional<double>(0.875));
  EXPECT_EQ(default_expert_boundary("i2v"), std::optional<double>(0.9));
  EXPECT_FALSE(default_expert_boundary("ti2v").has_value());
}

TEST(SamplerDefaults, UnsetKeysTakeTheOfficialSamplersAndGivenOnesStay) {
  struct Case {
    std::string model_type;
    std::size_t experts;
    std::int64_t steps;
    double shift;
    std::string guidance;
  };
  for (const auto& c : {Case{"t2v", 2, 40, 12.0, "3,4"}, Case{"i2v", 2, 40, 5.0, "3.5"}, Case{"ti2v", 1, 50, 5.0, "5"},
                        Case{"t2v", 1, 7, 1.5, "2"}, Case{"i2v", 1, 7, 1.5, "2"}}) {
    TempDir dir("wd-sampler-defaults");
    const auto experts = teacher(dir, c.model_type, c.experts);
    const auto label = c.model_type + " x" + std::to_string(c.experts);
    Keys unset;
    eval::take_official_defaults(experts, {}, unset.bind());
    EXPECT_EQ(unset.steps, c.steps) << label;
    EXPECT_EQ(unset.shift, c.shift) << label;
    EXPECT_EQ(unset.guidance.str(), c.guidance) << label;
    // An explicit value always wins, key by key.
    Keys given;
    eval::take_official_defaults(experts, {"teacher.shift", "teacher.guidance"}, given.bind());
    EXPECT_EQ(given.steps, c.steps) << label;
    EXPECT_EQ(given.shift, 1.5) << label;
    EXPECT_EQ(given.guidance.str(), "2") << label;
  }
}

TEST(SamplerDefaults, ATwoExpertTeacherSaysWhereItsBoundaryCameFrom) {
  TempDir dir("wd-sampler-defaults");
  write_random_wan_experts(dir.str(), tiny("t2v"), torch::kFloat, 1ULL << 30, 3);
  EXPECT_EQ(WanExperts::open(dir.str()).boundary_origin(), "the official T2V-A14B (model_type t2v, two experts)'s");
  EXPECT_EQ(WanExperts::open(dir.str(), 0.5).boundary_origin(), "set explicitly");
  TempDir pipeline("wd-sampler-defaults");
  write_random_wan_experts(pipeline.str(), tiny("t2v"), torch::kFloat, 1ULL << 30, 3, KeyLayout::kDiffusers);
  EXPECT_EQ(WanExperts::open(pipeline.str()).boundary_origin(),
            "the boundary_ratio of " + pipeline.str() + "/model_index.json");
}

}  // namespace
}  // namespace wd::test_sampler_defaults
