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
  const auto read = src_.samples.read(position, eval, src_.plan.per_token_seq_len, src_.patch);
  auto b = read.stage_input(src_.patch);
  if (!eval && src_.cond_dropout > 0) {
    const auto& indices = read.clean.indices;
    for (std::size_t i = 0; i < indices.size(); ++i) {
      if (context_dropped(src_.seed, indices[i], position, src_.cond_dropout)) {
        b.context[static_cast<std::int64_t>(i)].zero_();
      }
    }
  }
  b.out = read.noisy.noise - read.clean.latents;
  return b;
}

}  // namespace wd::teacher
