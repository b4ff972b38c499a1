// Where a stream's batches come from, and the one place a training message is made. An
// objective names its source (objective::ObjectiveSpec::source): the data and the teacher's
// forward (velocity, guided, dmd), the teacher's trajectories (trajectory), the data alone
// (flow's targets). A teacher rank's first stage asks it for each batch (run_teacher); a rank
// that computes its own messages (a colocated teacher, flow) asks it through a LocalReceiver.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/receiver.hpp"
#include "comm/stream_plan.hpp"
#include "data/dataset_reader.hpp"
#include "data/noiser.hpp"
#include "data/sample_schedule.hpp"
#include "teacher/teacher_stage.hpp"

namespace wd::teacher {

class StoredTrajectories;  // teacher/trajectory.hpp

/// The samples of one stream position, read and noised (SampleStream::read).
struct NoisedSamples {
  data::CleanBatch clean;  ///< as the data set holds them: latents, context, lengths, indices
  data::NoisyBatch noisy;  ///< x_t, t and σ, and the noise ε they were made with
  /// A first stage's input: x_t, t, context and context_lens, with the data set's image
  /// condition as the model takes it (condition_input on the DiT's `patch`: i2v's y, or ti2v's
  /// clean first frame at t = 0).
  StageBatch stage_input(const std::array<std::int64_t, 3>& patch) const;
};

/// Stops the stream at a non-finite teacher output (`what`: "teacher's output", a stage's "hidden
/// state"), which would silently poison every student: a NumericalError naming it, stream step
/// `step` and how many of its values are NaN/Inf. One counted host read when all are finite.
void check_finite(const torch::Tensor& produced, std::int64_t step, const std::string& what);

/// Which samples one replica reads at each stream position, and their noise; owned by the caller.
/// The rank is replica `replica` of `replicas`: a teacher replica (per_replica = the samples of
/// all its students, or one student's under comm.mode broadcast) or, computing its own messages,
/// one student (per_replica = train.batch_size), which then reads what student `replica` of a
/// dedicated layout with one student per teacher replica would get.
struct SampleStream {
  data::DatasetReader& reader;
  const data::SampleSchedule& schedule;  ///< training samples [0, train_samples), batch_per_replica = per_replica
  const data::FlowMatchingNoiser& noiser;
  const data::FlowMatchingNoiser& eval_noiser;
  int replica = 0;
  int replicas = 1;
  std::int64_t per_replica = 1;
  std::int64_t train_samples = 0;  ///< held-out samples follow these in the file

  /// The samples of training position `position` (the sample schedule's batch), or of held-out
  /// message `position` (eval_indices).
  std::vector<std::int64_t> indices(std::int64_t position, bool eval) const;
  const data::FlowMatchingNoiser& noiser_for(bool eval) const { return eval ? eval_noiser : noiser; }
  /// The samples of `position` (indices()) read, and noised by noiser_for(eval) for that position
  /// (the noise depends on the sample index and the position only, not on the batch), t shaped by
  /// `per_token_seq_len` (comm::StreamPlan) and the DiT's `patch`: the one place a source reads
  /// its data.
  NoisedSamples read(std::int64_t position, bool eval, std::int64_t per_token_seq_len,
                     const std::array<std::int64_t, 3>& patch) const;
};

/// The held-out samples of (replica, eval message e): contiguous positions after train_samples.
std::vector<std::int64_t> eval_indices(std::int64_t e, int replica, std::int64_t per_replica, int replicas,
                                       std::int64_t train_samples);

/// The samples replica `replica` of `replicas` reads at training position `position` (batch
/// `position` of `schedule`, whose batch_per_replica is `per_replica`) or, when `eval`, at
/// held-out message `position` (eval_indices): what SampleStream and the trajectory rounds read.
std::vector<std::int64_t> replica_indices(const data::SampleSchedule& schedule, int replica, int replicas,
                                          std::int64_t per_replica, std::int64_t train_samples,
                                          std::int64_t position, bool eval);

/// The batches of one replica's stream, one per objective (ObjectiveSpec::source). A batch is a
/// function of its position alone, so a resumed run gets the same batches.
class TargetSource {
 public:
  virtual ~TargetSource() = default;
  /// The batch of training position `position` (the data stream's: optimizer step · micro-batches
  /// + micro-batch), or of held-out message `position` when `eval`: x_t, t, context, context_lens
  /// and `out`, the student's target (a pipeline stage before the last leaves `hidden` instead).
  virtual StageBatch make(std::int64_t position, bool eval) = 0;
};

/// What an objective's source is made from; owned by the caller.
struct SourceParts {
  SampleStream samples;
  TeacherStage* stage = nullptr;  ///< this rank's teacher stage (the first); null: no teacher (flow)
  const comm::StreamPlan& plan;
  std::array<std::int64_t, 3> patch{1, 2, 2};  ///< the model's patch (per-token timesteps)
  /// The student's timesteps (student.expert's side): a trajectory's intervals that start in it.
  data::TimestepRange range;
  /// A trajectory stream's stored trajectories (a teacher cache of them), read instead of sampled;
  /// null: the stage samples them.
  StoredTrajectories* stored = nullptr;
};

/// The data and the stage's forward (velocity, guided, dmd): the samples noised, then this
/// stage's blocks (guided when the stage's guidance is set); a training batch of a plan without
/// training targets (StreamPlan::train_targets false) carries zeros and runs no forward.
class StageTargets final : public TargetSource {
 public:
  StageTargets(SampleStream samples, TeacherStage& stage, const comm::StreamPlan& plan)
      : samples_(samples), stage_(stage), plan_(plan) {}
  StageBatch make(std::int64_t position, bool eval) override;

 private:
  SampleStream samples_;
  TeacherStage& stage_;
  const comm::StreamPlan& plan_;
};

/// The training message of samples [lo, hi) of a made batch: x_t, t, context, context_lens,
/// teacher_out, feat.<j> and x_start where made (views of `batch`). Every student message, from a
/// teacher rank or computed on the student's rank, is made here.
comm::TensorDict student_message(const StageBatch& batch, std::int64_t lo, std::int64_t hi);

/// `message` with every tensor on `device` (asynchronous copies from the host), except
/// `context_lens`, which stays on the host: the DiT reads the lengths on the host, and a copy
/// on the device would cost it a synchronisation at every forward.
comm::TensorDict message_on_device(const comm::TensorDict& message, const c10::Device& device);

/// Where transport step `step` of a rank that computes its own messages sits in its stream: the
/// held-out messages first, then the training micro-batches by their position in the data stream.
struct StreamPosition {
  std::int64_t position = 0;  ///< the held-out message, or the data stream's position
  bool eval = false;
};
StreamPosition stream_position(const comm::StreamPlan& plan, std::int64_t step);

/// A Receiver whose messages are computed on this rank (a colocated teacher, flow's targets) by a
/// source, one student's batch each. Steps come in order, one held at a time: recv(s) after
/// release(s - 1); each message goes to `device` (message_on_device). wait_seconds() is 0
/// (nothing is waited for); compute_seconds() is the computing's share of this rank's time.
class LocalReceiver final : public comm::Receiver {
 public:
  /// `what` names the receiver in its errors ("colocated teacher"); `check_finite`: a message
  /// whose target has NaN/Inf values stops the run (a teacher's output; the data's need no check).
  LocalReceiver(std::string what, TargetSource& source, const comm::StreamPlan& plan, c10::Device device,
                bool check_finite)
      : what_(std::move(what)), source_(source), plan_(plan), device_(device), check_finite_(check_finite) {}
  const comm::Message& recv(std::int64_t step) override;
  void release(std::int64_t step) override;
  double wait_seconds() const override { return 0; }
  double compute_seconds() const { return compute_seconds_; }

 private:
  std::string what_;
  TargetSource& source_;
  const comm::StreamPlan& plan_;
  c10::Device device_;
  bool check_finite_;
  comm::Message held_;
  std::int64_t next_ = -1;  ///< the step recv expects next; -1 before the first
  double compute_seconds_ = 0;
};

}  // namespace wd::teacher
