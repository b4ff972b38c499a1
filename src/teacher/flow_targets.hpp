// train.objective flow: the targets of flow-matching training, computed on the student's own rank
// from the data alone (no teacher). Each message is what a teacher would send, with the velocity
// of the noising path, ε − x0, where the teacher's output would be.
#pragma once

#include <cstdint>

#include "comm/stream_plan.hpp"
#include "teacher/colocated_teacher.hpp"
#include "data/dataset_reader.hpp"
#include "data/noiser.hpp"
#include "data/sample_schedule.hpp"

namespace wd::teacher {

/// What the flow targets are computed from; owned by the caller. As for a colocated teacher,
/// the rank is replica `replica` of `replicas` (one per student rank).
struct FlowSource {
  data::DatasetReader& reader;
  const data::SampleSchedule& schedule;
  const data::FlowMatchingNoiser& noiser;
  const data::FlowMatchingNoiser& eval_noiser;
  const comm::StreamPlan& plan;
  std::array<std::int64_t, 3> patch{1, 2, 2};  ///< the model's patch (per-token timesteps)
  int replica = 0;
  int replicas = 1;
  std::int64_t train_samples = 0;
  double cond_dropout = 0;  ///< train.cond_dropout: training samples whose context is zeroed
  std::uint64_t seed = 0;   ///< train.seed: which samples are dropped
  c10::Device device = torch::kCPU;  ///< the student's device: where every message tensor goes
};

/// Whether the context of sample `sample` at stream position `position` is dropped: a hash of
/// (seed, sample, position) below `p`, the same on every rank and run.
bool context_dropped(std::uint64_t seed, std::int64_t sample, std::int64_t position, double p);

/// A Receiver whose messages carry flow-matching targets: x_t = (1 − σ)·x0 + σ·ε, t = 1000·σ
/// (the noisers'), teacher_out = ε − x0, context zeroed for the dropped training samples (never
/// for held-out ones). Steps come in order, one held at a time (LocalReceiver).
class FlowTargets : public LocalReceiver {
 public:
  explicit FlowTargets(FlowSource source) : LocalReceiver("flow targets", source.device), src_(source) {}

 private:
  comm::TensorDict compute(std::int64_t step) override;
  FlowSource src_;
};

}  // namespace wd::teacher
