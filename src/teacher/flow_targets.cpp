// Flow-matching targets from the data alone (flow_targets.hpp).
#include "teacher/flow_targets.hpp"

#include "core/errors.hpp"
#include "teacher/colocated_teacher.hpp"

namespace wd::teacher {

namespace {

/// SplitMix64: one well-mixed 64-bit value from one input.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

bool context_dropped(std::uint64_t seed, std::int64_t sample, std::int64_t position, double p) {
  if (p <= 0) return false;
  const auto h = mix(mix(mix(seed ^ 0xC0D7D40FULL) ^ static_cast<std::uint64_t>(sample)) ^
                     static_cast<std::uint64_t>(position));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < p;
}

const comm::Message& FlowTargets::recv(std::int64_t step) {
  WD_CHECK(held_.step < 0, "flow targets: recv(" << step << ") while step " << held_.step << " is not released");
  WD_CHECK(next_ < 0 || step == next_,
           "flow targets: recv(" << step << ") but step " << next_ << " comes next (steps are received in order)");
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
  const comm::TensorDict message{{"x_t", noisy.x_t},
                                 {"t", noisy.t},
                                 {"context", context},
                                 {"context_lens", clean.context_lens},
                                 {"teacher_out", noisy.noise - clean.latents}};
  held_.step = step;
  held_.tensors = message_on_device(message, src_.device);
  next_ = step + 1;
  return held_;
}

void FlowTargets::release(std::int64_t step) {
  WD_CHECK(step == held_.step, "flow targets: release(" << step << ") but step " << held_.step << " is held");
  held_.tensors.clear();
  held_.step = -1;
}

}  // namespace wd::teacher
