// train.objective flow: the targets of flow-matching training, computed on the student's own rank
// from the data alone (no teacher). Each batch is what a teacher would send, with the velocity
// of the noising path, ε − x0, where the teacher's output would be.
#pragma once

#include <array>
#include <cstdint>

#include "comm/stream_plan.hpp"
#include "teacher/target_source.hpp"

namespace wd::teacher {

/// What the flow targets are computed from; owned by the caller.
struct FlowSource {
  SampleStream samples;  ///< one student's share (per_replica = train.batch_size)
  const comm::StreamPlan& plan;
  std::array<std::int64_t, 3> patch{1, 2, 2};  ///< the model's patch (per-token timesteps)
  double cond_dropout = 0;  ///< train.cond_dropout: training samples whose context is zeroed
  std::uint64_t seed = 0;   ///< train.seed: which samples are dropped
};

/// Whether the context of sample `sample` at stream position `position` is dropped: a hash of
/// (seed, sample, position) below `p`, the same on every rank and run.
bool context_dropped(std::uint64_t seed, std::int64_t sample, std::int64_t position, double p);

/// The source of flow-matching batches: x_t = (1 − σ)·x0 + σ·ε, t = 1000·σ (the noisers'),
/// out = ε − x0, context zeroed for the dropped training samples (never for held-out ones).
class FlowTargets final : public TargetSource {
 public:
  explicit FlowTargets(FlowSource source) : src_(source) {}
  StageBatch make(std::int64_t position, bool eval) override;

 private:
  FlowSource src_;
};

}  // namespace wd::teacher
