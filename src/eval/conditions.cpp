// Sampling conditions: noise, contexts, the negative context (conditions.hpp).
#include "eval/conditions.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

#include "core/config.hpp"
#include "core/errors.hpp"
#include "data/dataset_info.hpp"
#include "data/dataset_reader.hpp"
#include "data/splitmix64.hpp"
#include "job/plan_input.hpp"
#include "model/negative_context.hpp"

namespace wd::eval {

namespace {
constexpr std::uint64_t kSampleNoiseStream = 11;
constexpr std::uint64_t kSampleContextStream = 12;
}  // namespace

SamplingConditions SamplingConditions::slice(std::int64_t lo, std::int64_t hi) const {
  SamplingConditions c;
  const auto B = noise.size(0);
  c.noise = noise.slice(0, lo, hi);
  c.context = context.slice(0, lo, hi);
  c.negative = negative.slice(0, lo, hi);
  c.lens = torch::cat({lens.slice(0, lo, hi), lens.slice(0, B + lo, B + hi)});
  c.indices.assign(indices.begin() + lo, indices.begin() + hi);
  c.image = image.slice(lo, hi);
  return c;
}

SamplingConditions make_conditions(const ConditionSource& src, const WanConfig& tc, const c10::Device& device) {
  SamplingConditions c;
  std::array<std::int64_t, 3> fhw{};
  if (!src.data_path.empty()) {
    // Sampling reads the contexts, the latent shape and the image conditions the teacher takes
    // (a t2v teacher ignores a data set's).
    const auto info = data::validate_dataset(
        src.data_path, job::dataset_expectations(tc, image_condition_of(tc) == ImageCondition::kNone));
    c.indices = parse_indices(src.samples, info.samples);
    data::DatasetReader reader(info);
    const auto batch = reader.read(c.indices);
    c.context = batch.context;
    c.lens = batch.context_lens;
    if (batch.condition.defined()) c.image = {batch.condition_kind, batch.condition.to(device), tc.patch_size};
    fhw = {info.latent_shape[1], info.latent_shape[2], info.latent_shape[3]};
  } else {
    WD_CHECK_AS(ConfigError, image_condition_of(tc) != ImageCondition::kI2v,
                "the teacher (model_type i2v) samples from an image: give --data.path, a data set with each "
                "sample's image condition (/condition; docs/data-format.md#image-conditions)");
    const auto d = parse_dims(src.latent, 3, "latent");
    fhw = {d[0], d[1], d[2]};
    std::vector<torch::Tensor> ctx;
    for (std::int64_t b = 0; b < src.count; ++b) {
      c.indices.push_back(b);
      auto gen = at::detail::createCPUGenerator(data::hash_keys(src.seed, kSampleContextStream, b));
      ctx.push_back(torch::randn({tc.text_len, tc.text_dim}, gen));
    }
    c.context = torch::stack(ctx);
    c.lens = torch::full({src.count}, tc.text_len, torch::kLong);
  }
  std::vector<torch::Tensor> noise;
  for (const auto i : c.indices) {
    auto gen = at::detail::createCPUGenerator(data::hash_keys(src.seed, kSampleNoiseStream, i));
    noise.push_back(torch::randn({tc.out_dim, fhw[0], fhw[1], fhw[2]}, gen));
  }
  c.noise = torch::stack(noise);
  const auto B = c.noise.size(0);
  if (src.negative.empty()) {
    c.negative = torch::zeros_like(c.context);
  } else {
    const auto neg = load_negative_context(src.negative, tc.text_dim).unsqueeze(0);
    c.negative = neg.expand({B, neg.size(1), neg.size(2)}).contiguous();
  }
  // One width for the batched [cond; uncond] forward; the lengths keep each context's own rows.
  const auto width = std::max(c.context.size(1), c.negative.size(1));
  c.context = torch::constant_pad_nd(c.context, {0, 0, 0, width - c.context.size(1)});
  const auto neg_rows = c.negative.size(1);
  c.negative = torch::constant_pad_nd(c.negative, {0, 0, 0, width - neg_rows});
  const auto neg_lens = torch::full({B}, neg_rows, torch::kLong);
  c.noise = c.noise.to(device);
  c.context = c.context.to(device);
  c.negative = c.negative.to(device);
  c.lens = torch::cat({c.lens, neg_lens});  // [cond; uncond] rows for one batched forward
  return c;
}

}  // namespace wd::eval
