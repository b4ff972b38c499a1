// Transport: the teacher -> student batch stream (non-blocking, prefetching, reused buffers).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_groups.hpp"
#include "comm/wait.hpp"
#include "core/config.hpp"

namespace wd::comm {

/// `[comm]` section of the config.
struct CommConfig {
  int prefetch_depth = 2;          ///< batches a teacher may run ahead / a student posts ahead
  double timeout_s = 120.0;        ///< deadline of every wait
  std::string mode = "scatter";    ///< scatter: each student its slice | broadcast: all the same
  double bucket_mb = 25.0;         ///< gradient all-reduce bucket size
  double watchdog_s = 0;           ///< 0: 2 x timeout_s + 90
  std::string backend = "auto";    ///< auto | mpi | nccl (backend_choice.hpp)
  void bind(OptionTable& table);
  /// Seconds without progress after which the watchdog ends the rank.
  double watchdog_limit() const;
  /// bucket_mb in bytes, for GradientReducer.
  std::uint64_t bucket_bytes() const;
  void validate(ConfigProblems& problems) const;
};

/// One tensor of a message: name, dtype, shape.
struct TensorSpec {
  std::string name;
  c10::ScalarType dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t bytes() const;
};

/// Shapes and dtypes of the message one student receives per step. Fixed for a run, so every
/// buffer is allocated once.
struct MessageSpec {
  std::vector<TensorSpec> tensors;
  /// Payload bytes as laid out in a buffer (without the small header): each tensor starts on a
  /// 64-byte boundary so the received views are aligned for vectorised kernels.
  std::uint64_t bytes() const;
  /// Byte offset of each tensor within the payload, in `tensors` order.
  std::vector<std::uint64_t> offsets() const;
  /// FNV-1a over names, dtypes and shapes: the two ends of a stream compare it to catch drift.
  std::uint64_t hash() const;
};

/// Named tensors of one message.
using TensorDict = std::map<std::string, torch::Tensor>;

/// True for the message tensors a receiver keeps on the host whatever its device: the sample
/// lengths (`context_lens`, B integers), which the DiT reads on the host; on the device they
/// would cost a synchronisation at every forward.
inline bool host_resident(const std::string& name) { return name == "context_lens"; }

/// Throws wd::Error unless `dict` holds exactly the spec's tensors, each defined and of the
/// spec's shape; the message names `who` it is for and the step.
void check_message(const MessageSpec& spec, const TensorDict& dict, std::int64_t step, const std::string& who);

/// Slots of a stream's ring: comm.prefetch_depth, at least one, at most the steps [first, end).
std::size_t ring_slots(int prefetch_depth, std::int64_t first, std::int64_t end);

/// A received message: tensors view a ring slot and stay valid until `release(step)`.
struct Message {
  std::int64_t step = -1;
  TensorDict tensors;
  const torch::Tensor& at(const std::string& name) const;
};

class Transport {
 public:
  virtual ~Transport() = default;
  /// Teacher (a replica's sending rank): copies each student's message into a send slot and
  /// starts the sends; waits (with deadline) only when prefetch_depth steps are still in flight.
  /// `per_student[i]` goes to the replica's student i.
  virtual void send(std::int64_t step, const std::vector<TensorDict>& per_student) = 0;
  /// Teacher, broadcast mode: the same message to every student of the replica.
  virtual void broadcast(std::int64_t step, const TensorDict& message) = 0;
  /// Student: the message of `step` (steps are consumed in order, first_step..end_step-1);
  /// waits with deadline. Receives are posted prefetch_depth steps ahead.
  virtual const Message& recv(std::int64_t step) = 0;
  /// Student: returns the slot of `step`; its receive is reposted for a later step.
  virtual void release(std::int64_t step) = 0;
  /// Teacher: waits (with deadline) until every send completed.
  virtual void flush() = 0;
  /// Seconds spent blocked in waits so far (for "wait fraction" metrics).
  virtual double wait_seconds() const = 0;
  /// Testing aid, for sending ends: `hook(step)` runs inside send/broadcast of every step, once
  /// the step's sends are started and before they complete (a rank dying mid-send). A
  /// receiving end never sends, so it ignores the hook.
  virtual void set_send_fault_hook(FaultHook hook) { static_cast<void>(hook); }
};

/// One end of a stream over a communicator: the sending end (its receivers, in message order)
/// or a receiving end (its one sender).
struct StreamEnd {
  MPI_Comm comm = MPI_COMM_NULL;
  int world_rank = -1;
  bool sending = false;
  std::vector<int> peers;       ///< world ranks: the receivers in message order, or {sender}
  std::vector<int> peer_ranks;  ///< the same ranks in `comm`
  bool broadcast = false;       ///< one message for every receiver (comm.mode = broadcast)
  std::string name;             ///< "the teacher -> student link of replica 0", for messages
  std::string receiver = "receiver";  ///< what a receiver is called in messages ("student")
};

/// How logs and errors name a stream: "the teacher -> student link of replica R" and "the stage
/// K -> K+1 link of replica R" (train and layout say the same).
std::string student_link_name(int replica);
std::string stage_link_name(int replica, int from_stage);

/// `world_rank`'s end of its replica's teacher -> student link (`groups.link()`: the last
/// teacher stage is rank 0, the students follow in slot order). Throws wd::Error on a rank
/// without a link (a teacher stage before the last).
StreamEnd link_end(const ProcessGroups& groups, int world_rank, const CommConfig& config);

/// `world_rank`'s ends of the stage links of its replica (teacher.placement = shard): `in`
/// from the previous stage over `groups.stage_in()`, `out` to the next over
/// `groups.stage_out()`; `comm` is MPI_COMM_NULL where there is no such stage.
struct StageEnds {
  StreamEnd in, out;
};
StageEnds stage_ends(const ProcessGroups& groups, int world_rank);

/// The MPI implementation of one end (host tensors). Steps [first_step, end_step) are
/// streamed; a receiving end cancels its outstanding receives when destroyed early. `pinned`
/// page-locks the ring buffers (only in a CUDA build: a CUDA device copies to or from them).
std::unique_ptr<Transport> make_mpi_stream(const StreamEnd& end, const MessageSpec& spec,
                                           const CommConfig& config, std::int64_t first_step,
                                           std::int64_t end_step, bool pinned = false);

/// make_mpi_stream on `world_rank`'s end of the teacher -> student link.
std::unique_ptr<Transport> make_mpi_transport(const ProcessGroups& groups, int world_rank,
                                              const MessageSpec& spec, const CommConfig& config,
                                              std::int64_t first_step, std::int64_t end_step,
                                              bool pinned = false);

}  // namespace wd::comm
