// SamplingModel: teacher and student velocities for the samplers (sampling_model.hpp).
#include "model/sampling_model.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <memory>

#include "core/errors.hpp"
#include "model/safetensors.hpp"
#include "model/wan_checkpoint.hpp"

namespace wd {

torch::Tensor SamplingModel::over_channels(const std::string& name, const torch::Tensor& x) const {
  if (!heads.count(name + ".weight")) return x;
  auto y = torch::matmul(x.movedim(1, -1), heads.at(name + ".weight").t());
  if (heads.count(name + ".bias")) y = y + heads.at(name + ".bias");
  return y.movedim(-1, 1);
}

torch::Tensor SamplingModel::operator()(const torch::Tensor& x, double sigma, const torch::Tensor& context,
                                        const torch::Tensor& lens, const ImageInput& image) {
  const auto in = image.at(x, sigma);
  return over_channels("out_proj", forward(over_channels("in_proj", in.x_t), in.t, context, lens, in.y));
}

double SamplingModel::scale_at(const GuidanceScale& g, double sigma) const {
  if (!g.per_expert()) return g.low;
  WD_CHECK_AS(ConfigError, experts && experts->two_experts(),
              "guidance(" << g.str() << ") gives each expert of a two-expert teacher its own scale; this teacher has "
                          << "one expert: give one scale");
  return g.of(experts->expert_for(static_cast<float>(1000.0 * sigma)) == WanExperts::kHigh);
}

torch::Tensor SamplingModel::guided(const torch::Tensor& x, double sigma, const torch::Tensor& context,
                                    const torch::Tensor& negative, const torch::Tensor& lens, double g,
                                    const ImageInput& image) {
  torch::NoGradGuard no_grad;
  const auto B = x.size(0);
  if (g == 1.0) return (*this)(x, sigma, context, lens.slice(0, 0, B), image);
  const auto both = (*this)(torch::cat({x, x}), sigma, torch::cat({context, negative}), lens, image.twice());
  return both.slice(0, B) + g * (both.slice(0, 0, B) - both.slice(0, B));
}

SamplingModel load_sampling_student(const std::string& path, std::optional<c10::ScalarType> dtype,
                                    const c10::Device& device, std::optional<double> boundary) {
  SamplingModel student;
  if (WanExperts::is_two_expert_dir(path)) {
    auto experts = std::make_shared<WanExperts>(WanExperts::open(path, boundary));
    auto models = std::make_shared<std::vector<WanDiT>>(load_wan_experts(*experts, dtype, device));
    student.forward = [experts, models](const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& context,
                                        const torch::Tensor& lens, const torch::Tensor& y) {
      return torch::stack(experts_forward(*models, *experts, WanInputs::batched(x, t, context, lens, 0, y)))
          .to(torch::kFloat);
    };
    spdlog::info("student: two experts, {}/ for t >= {} and {}/ below{}; {}", experts->expert_name(WanExperts::kHigh),
                 experts->boundary_timestep(), experts->expert_name(WanExperts::kLow),
                 experts->expert(WanExperts::kHigh).lora() ? " (a LoRA pair, each merged over its base)" : "",
                 experts->config().summary());
    return student;
  }
  const auto ck = WanCheckpoint::open(path);
  auto model = load_wan_dit(ck, dtype, device);
  student.forward = [model](const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& context,
                            const torch::Tensor& lens, const torch::Tensor& y) mutable {
    return torch::stack(model->forward(WanInputs::batched(x, t, context, lens, 0, y))).to(torch::kFloat);
  };
  const auto heads = std::filesystem::path(path) / "distill_heads" / "heads.safetensors";
  if (std::filesystem::exists(heads)) {
    const auto f = SafetensorsFile::open(heads.string());
    for (const auto& info : f.tensors()) student.heads[info.name] = f.tensor(info.name, torch::kFloat, device);
  }
  spdlog::info("student: {}", ck.config().summary());
  return student;
}

}  // namespace wd
