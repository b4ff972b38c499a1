// teacher.placement = colocated: a student rank's own teacher. It stands where the link to a
// teacher rank would be (a comm::Receiver the student loop receives from) and computes each
// message on the spot: read this rank's samples, noise them, run the teacher.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "comm/stream_plan.hpp"
#include "comm/receiver.hpp"
#include "data/dataset_reader.hpp"
#include "data/noiser.hpp"
#include "data/sample_schedule.hpp"
#include "teacher/teacher_stage.hpp"
#include "teacher/trajectory.hpp"

namespace wd::teacher {

/// What the colocated teacher computes from; owned by the caller. The rank is replica
/// `replica` of `replicas` (one per student rank), so it reads the same samples with the same
/// noise as student `replica` of a dedicated layout with one teacher replica.
struct ColocatedSource {
  TeacherStage& stage;  ///< every block (no pipeline)
  data::DatasetReader& reader;
  const data::SampleSchedule& schedule;  ///< batch_per_replica = train.batch_size
  const data::FlowMatchingNoiser& noiser;
  const data::FlowMatchingNoiser& eval_noiser;
  const comm::StreamPlan& plan;
  int replica = 0;
  int replicas = 1;
  std::int64_t train_samples = 0;
  c10::Device device = torch::kCPU;  ///< the student's device: where every message tensor goes
  /// train.objective trajectory: the messages come from this teacher's trajectories.
  TrajectoryRounds* trajectory = nullptr;
};

/// The samples a rank that computes its own messages (a colocated teacher, flow targets) reads
/// for transport step `step`: the held-out messages first (eval_indices, noised by the eval
/// noiser), then the training micro-batches by their position in the data stream (the sample
/// schedule), so that replica r of `replicas` reads what student r of a dedicated layout gets.
struct LocalSamples {
  std::vector<std::int64_t> indices;
  std::int64_t noise_step = 0;  ///< the noisers' step: the held-out message, or the stream position
  bool eval = false;            ///< a held-out message
};
LocalSamples local_samples(const comm::StreamPlan& plan, const data::SampleSchedule& schedule, int replica,
                           int replicas, std::int64_t train_samples, std::int64_t step);

/// `message` with every tensor on `device` (asynchronous copies from the host), except
/// `context_lens`, which stays on the host: the DiT reads the lengths on the host, and a copy
/// on the device would cost it a synchronisation at every forward.
comm::TensorDict message_on_device(const comm::TensorDict& message, const c10::Device& device);

/// A Receiver whose messages are computed on this rank (a colocated teacher, flow targets).
/// Steps come in order, one held at a time: recv(s) after release(s - 1); each message goes to
/// `device` (message_on_device). wait_seconds() is 0 (nothing is waited for); compute_seconds()
/// is the computing's share of this rank's time.
class LocalReceiver : public comm::Receiver {
 public:
  const comm::Message& recv(std::int64_t step) final;
  void release(std::int64_t step) final;
  double wait_seconds() const override { return 0; }
  double compute_seconds() const { return compute_seconds_; }

 protected:
  /// `what` names the receiver in its errors ("colocated teacher").
  LocalReceiver(std::string what, c10::Device device) : what_(std::move(what)), device_(device) {}
  /// The message of transport step `step`, on the host or any device.
  virtual comm::TensorDict compute(std::int64_t step) = 0;

 private:
  std::string what_;
  c10::Device device_;
  comm::Message held_;
  std::int64_t next_ = -1;  ///< the step recv expects next; -1 before the first
  double compute_seconds_ = 0;
};

/// The messages of a teacher rank, computed here by this rank's own teacher.
class ColocatedTeacher : public LocalReceiver {
 public:
  explicit ColocatedTeacher(ColocatedSource source)
      : LocalReceiver("colocated teacher", source.device), src_(source) {}

 private:
  comm::TensorDict compute(std::int64_t step) override;
  ColocatedSource src_;
};

}  // namespace wd::teacher
