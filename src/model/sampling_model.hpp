// SamplingModel: the velocity a sampler steps with: a teacher (one model or the two experts of an
// A14B folder) or a student with its channel projections; shared by `sample` and `evaluate`.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/guidance_scale.hpp"
#include "model/image_condition.hpp"
#include "model/wan_dit.hpp"
#include "model/wan_experts.hpp"

namespace wd {

/// One model's velocity at (x, σ): the teacher (one or two experts, in a placement:
/// teacher::load_sampling_teacher) or a student with its channel projections
/// (distill_heads/heads.safetensors) when its channels differ from the teacher's.
struct SamplingModel {
  /// The model's output [B,out_dim,F,H,W] fp32 on x's device for x [B,C,F,H,W] (in the model's
  /// channels), t [B] (or per token [B,S]) on the host, context [B,L,D], lens [B] and an i2v
  /// model's y (undefined otherwise).
  using Forward = std::function<torch::Tensor(const torch::Tensor& x, const torch::Tensor& t,
                                              const torch::Tensor& context, const torch::Tensor& lens,
                                              const torch::Tensor& y)>;
  Forward forward;
  std::optional<WanExperts> experts;  ///< the teacher's checkpoints (its config, its mappings)
  std::map<std::string, torch::Tensor> heads;

  /// The velocity of `x` [B,C,F,H,W] at σ (t = 1000·σ, as the noiser) with `context`/`lens`
  /// and the samples' image condition (ImageInput::at: i2v's y, ti2v's clean first frame).
  torch::Tensor operator()(const torch::Tensor& x, double sigma, const torch::Tensor& context,
                           const torch::Tensor& lens, const ImageInput& image = {});
  /// Classifier-free guidance in one batched forward: `context` and `negative` [B,L,D] of one
  /// width, `lens` [2B] (the conditional lengths, then the negative's), the image in both
  /// halves; g = 1: one plain forward.
  torch::Tensor guided(const torch::Tensor& x, double sigma, const torch::Tensor& context,
                       const torch::Tensor& negative, const torch::Tensor& lens, double g,
                       const ImageInput& image = {});
  /// The scale of `g` at σ: its one scale, or per expert the scale of the expert that computes
  /// at σ (this model's two experts, routed as the samplers route fp32 1000·σ; a ConfigError for a
  /// model without two).
  double scale_at(const GuidanceScale& g, double sigma) const;

 private:
  torch::Tensor over_channels(const std::string& name, const torch::Tensor& x) const;
};

/// A student folder (RUN_DIR/student) with its projections, or a two-expert student folder (a
/// LoRA pair of student.expert runs, or any two-expert checkpoint folder): its experts routed by
/// t as the teacher's, at `boundary` (the teacher's; nullopt: the folder's or its type's default).
SamplingModel load_sampling_student(const std::string& path, std::optional<c10::ScalarType> dtype,
                                    const c10::Device& device, std::optional<double> boundary = std::nullopt);

}  // namespace wd
