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

StageBatch FlowTargets::make(std::int64_t position, bool eval) {
  const auto& samples = src_.samples;
  auto clean = samples.reader.read(samples.indices(position, eval));
  auto noisy = samples.noiser_for(eval).apply(clean.latents, clean.indices, position, src_.plan.per_token_seq_len,
                                              src_.patch);
  auto context = clean.context;
  if (!eval && src_.cond_dropout > 0) {
    for (std::size_t i = 0; i < clean.indices.size(); ++i) {
      if (context_dropped(src_.seed, clean.indices[i], position, src_.cond_dropout)) {
        context[static_cast<std::int64_t>(i)].zero_();
      }
    }
  }
  StageBatch b;
  b.x_t = noisy.x_t;
  b.t = noisy.t;
  b.context = context;
  b.context_lens = clean.context_lens;
  b.out = noisy.noise - clean.latents;
  return b;
}

}  // namespace wd::teacher
