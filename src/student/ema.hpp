// train.ema_decay: an exponential moving average of the student's weights, the weights a user
// samples with. Distilled few-step students are averaged in every released recipe (the weights
// the optimizer leaves at one step swing from step to step; their average does not).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "student/student_parts.hpp"

namespace wd::student {

class EmaWeights {
 public:
  static constexpr const char* kFile = "ema.safetensors";  ///< in a checkpoint directory

  /// An fp32 copy of every trainable tensor of `parts`, on its device. decay in (0, 1).
  EmaWeights(const StudentParts& parts, double decay);

  /// The decay used after optimizer step `step` (1-based): min(decay, (1 + step) / (10 + step)),
  /// so the first steps are not held to the initial weights for ~1/(1 − decay) steps.
  double decay_at(std::int64_t step) const;
  /// After optimizer step `step` (1-based): ema ← d·ema + (1 − d)·w with d = decay_at(step).
  void update(const StudentParts& parts, std::int64_t step);

  /// Writes `dir/ema.safetensors` (the trainable names; decay as metadata).
  void save(const std::string& dir, const StudentParts& parts) const;
  /// Restores from checkpoint `dir`: its ema.safetensors when there is one (a tensor missing or
  /// of another shape is a DataError naming the file and the tensor), else the restored weights
  /// (a checkpoint of a run without an average; logged).
  void restore(const std::string& dir, const StudentParts& parts);
  /// Runs `fn` with the averaged weights in `parts` (and its compute copy), then puts the
  /// trained weights back exactly.
  void with_averaged(StudentParts& parts, const std::function<void()>& fn) const;

  const std::vector<torch::Tensor>& tensors() const { return ema_; }
  double decay() const { return decay_; }

 private:
  double decay_;
  std::vector<torch::Tensor> ema_;
};

}  // namespace wd::student
