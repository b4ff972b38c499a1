// StudentConfig (`[student]`) and TrainConfig (`[train]`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "model/wan_config.hpp"

namespace wd::student {

/// The student DiT, keyed with the Wan config names; 0 means "the teacher's value".
struct StudentConfig {
  std::int64_t dim = 64;
  std::int64_t ffn_dim = 128;
  std::int64_t num_heads = 4;
  std::int64_t num_layers = 2;
  std::int64_t in_dim = 0;
  std::int64_t out_dim = 0;
  std::int64_t freq_dim = 0;
  /// random | teacher-blocks:i,j,... (copy those teacher blocks; needs equal dims)
  std::string init = "random";

  void bind(OptionTable& t);
  void validate(ConfigProblems& p) const;
  /// The student's WanConfig: the teacher's with this struct's fields applied.
  WanConfig model_config(const WanConfig& teacher) const;
  /// Teacher block indices of `teacher-blocks:...` (empty for random).
  std::vector<std::int64_t> teacher_blocks() const;
};

struct TrainConfig {
  std::int64_t steps = 300;        ///< optimizer steps
  std::int64_t batch_size = 2;     ///< samples per student rank per step
  double lr = 2e-3;
  double min_lr = 1e-4;            ///< end of the cosine decay
  std::int64_t warmup_steps = 10;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double grad_clip = 1.0;          ///< max global grad norm; 0 = off
  std::int64_t log_every = 10;
  std::int64_t eval_samples = 8;   ///< held-out samples (the last ones of the data set)
  std::int64_t eval_every = 0;     ///< 0 = evaluate at the start and the end only
  std::uint64_t seed = 0;

  void bind(OptionTable& t);
  void validate(ConfigProblems& p) const;
  /// Learning rate at `step`: linear warmup from 0, then cosine from lr to min_lr.
  double lr_at(std::int64_t step) const;
};

}  // namespace wd::student
