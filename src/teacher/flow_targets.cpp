// Flow-matching targets from the data alone (flow_targets.hpp).
#include "teacher/flow_targets.hpp"

#include "data/splitmix64.hpp"

namespace wd::teacher {

bool context_dropped(std::uint64_t seed, std::int64_t sample, std::int64_t position, double p) {
  if (p <= 0) return false;
  const auto h = data::hash_keys(seed ^ 0xC0D7D40FULL, static_cast<std::uint64_t>(sample),
                                 static_cast<std::uint64_t>(position));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < p;
}

comm::TensorDict FlowTargets::compute(std::int64_t step) {
  const auto at = local_samples(src_.plan, src_.schedule, src_.replica, src_.replicas, src_.train_samples, step);
  auto clean = src_.reader.read(at.indices);
  const auto& noiser = at.eval ? src_.eval_noiser : src_.noiser;
  auto noisy = noiser.apply(clean.latents, clean.indices, at.noise_step, src_.plan.per_token_seq_len, src_.patch);
  auto context = clean.context;
  if (!at.eval && src_.cond_dropout > 0) {
    for (std::size_t i = 0; i < clean.indices.size(); ++i) {
      if (context_dropped(src_.seed, clean.indices[i], at.noise_step, src_.cond_dropout)) {
        context[static_cast<std::int64_t>(i)].zero_();
      }
    }
  }
  return {{"x_t", noisy.x_t},
          {"t", noisy.t},
          {"context", context},
          {"context_lens", clean.context_lens},
          {"teacher_out", noisy.noise - clean.latents}};
}

}  // namespace wd::teacher
