// The student's weight average (ema.hpp).
#include "student/ema.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "core/errors.hpp"
#include "model/safetensors.hpp"
#include "student/train_state.hpp"

namespace wd::student {

EmaWeights::EmaWeights(const StudentParts& parts, double decay) : decay_(decay) {
  WD_CHECK_AS(ConfigError, decay > 0 && decay < 1, "train.ema_decay(" << decay << ") must be in (0, 1)");
  torch::NoGradGuard no_grad;
  for (const auto& p : parts.trainable()) ema_.push_back(p.detach().to(torch::kFloat).clone());
}

double EmaWeights::decay_at(std::int64_t step) const {
  const auto s = static_cast<double>(std::max<std::int64_t>(step, 0));
  return std::min(decay_, (1.0 + s) / (10.0 + s));
}

void EmaWeights::update(const StudentParts& parts, std::int64_t step) {
  torch::NoGradGuard no_grad;
  const auto& w = parts.trainable();
  WD_CHECK(w.size() == ema_.size(), "the weight average holds " << ema_.size() << " tensors, the student "
                                                                 << w.size());
  const double keep = decay_at(step);
  // lerp: ema + (1 − d)·(w − ema), the same value as d·ema + (1 − d)·w in one pass.
  for (std::size_t i = 0; i < w.size(); ++i) ema_[i].lerp_(w[i].detach(), 1.0 - keep);
}

void EmaWeights::save(const std::string& dir, const StudentParts& parts) const {
  TensorMap tensors;
  const auto& names = parts.trainable_names();
  for (std::size_t i = 0; i < ema_.size(); ++i) tensors[names[i]] = ema_[i];
  std::ostringstream decay;
  decay.precision(17);
  decay << decay_;
  write_safetensors((std::filesystem::path(dir) / kFile).string(), tensors,
                    {{"format", "wan-distill-ema"}, {"decay", decay.str()}});
}

void EmaWeights::restore(const std::string& dir, const StudentParts& parts) {
  torch::NoGradGuard no_grad;
  const auto path = (std::filesystem::path(dir) / kFile).string();
  const auto& w = parts.trainable();
  if (!std::filesystem::exists(path)) {
    for (std::size_t i = 0; i < w.size(); ++i) ema_[i].copy_(w[i]);
    spdlog::warn("train.ema_decay: {} has no {} (written without an average); the average starts from the "
                 "restored weights", dir, kFile);
    return;
  }
  const auto file = SafetensorsFile::open(path);
  const auto& names = parts.trainable_names();
  std::vector<torch::Tensor> loaded;
  for (std::size_t i = 0; i < w.size(); ++i) {  // every tensor checked before any is changed
    expect_saved_tensor(file, names[i], ema_[i]);
    loaded.push_back(file.tensor(names[i], torch::kFloat, ema_[i].device()));
  }
  WD_CHECK_DATA(file.tensors().size() == w.size(), path, "(tensors)",
                file.tensors().size() << " tensors, the student has " << w.size());
  for (std::size_t i = 0; i < w.size(); ++i) ema_[i].copy_(loaded[i]);
}

void EmaWeights::with_averaged(StudentParts& parts, const std::function<void()>& fn) const {
  torch::NoGradGuard no_grad;
  const auto& w = parts.trainable();
  std::vector<torch::Tensor> trained;
  for (std::size_t i = 0; i < w.size(); ++i) {
    trained.push_back(w[i].detach().clone());
    w[i].detach().copy_(ema_[i]);
  }
  parts.after_optimizer_step();  // the compute copy follows
  // The trained weights come back however fn ends (returns or throws).
  struct Restore {
    StudentParts& parts;
    const std::vector<torch::Tensor>& trained;
    ~Restore() {
      torch::NoGradGuard guard;
      const auto& w = parts.trainable();
      for (std::size_t i = 0; i < w.size(); ++i) w[i].detach().copy_(trained[i]);
      parts.after_optimizer_step();
    }
  } restore{parts, trained};
  fn();
}

}  // namespace wd::student
