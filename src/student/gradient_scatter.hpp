// GradientScatter (`student.shard gradients`, ZeRO-2): the student group's gradients are
// reduce-scattered bucket by bucket as the backward finishes them, so each rank keeps only the
// gradients of its own slice of the parameters; the full gradients never stay.
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "comm/health_channel.hpp"
#include "comm/shard_collectives.hpp"
#include "core/torch_compat.hpp"
#include "student/slice_layout.hpp"

namespace wd::student {

/// The parameters are laid out in order as one flat fp32 vector padded to a multiple of the group
/// size N; group rank r owns [r·S, (r+1)·S) (OptimizerShard's layout). Consecutive parameters
/// form buckets of at most bucket_bytes. Between begin_step() and reduce(), a hook on every
/// parameter's gradient accumulator counts the parameters of its bucket; once each has received
/// its gradient, the bucket's grads are packed into a buffer where the collectives work (the host
/// for MPI, the GPU for NCCL), dropped (.grad undefined) and reduce-scattered (rank r receives the
/// part of the bucket in its slice), overlapping the rest of the backward. Gradients arriving
/// after their bucket left (a parameter used twice, micro-batches) start the bucket again;
/// reduce() sends what is left the same way on every rank and adds each rank's parts into
/// `slice` (the averaged gradients of its slice). Device parameters: the packing happens in the
/// hook, which runs on the engine's device thread; NCCL starts the bucket's reduce-scatter there,
/// while MPI's calls wait for reduce() on the calling thread (MPI is funneled). The small
/// agreements (which buckets are left) are MPI's on either backend.
class GradientScatter {
 public:
  using Layout = SliceLayout;

  /// Not collective. `slice` (slice_size elements on the parameters' device) receives the
  /// averaged gradients; `peers` are the other students' world ranks (for timeout messages).
  /// `sources[i]` is the tensor the backward gives parameter i's gradient to (bf16-mixed: its
  /// bf16 compute copy, whose grad the send folds into the fp32 .grad and drops); empty: the
  /// parameters themselves. `collectives`: the reduce-scatter's backend (null: MPI over `students`).
  GradientScatter(MPI_Comm students, std::vector<torch::Tensor> params, Layout layout, std::uint64_t bucket_bytes,
                  torch::Tensor slice, std::chrono::duration<double> timeout, int world_rank, std::vector<int> peers,
                  comm::HealthChannel* health, std::vector<torch::Tensor> sources = {},
                  std::shared_ptr<comm::ShardCollectives> collectives = nullptr);
  /// Buffers of sends still in flight (an abandoned step) stay until the process exits.
  ~GradientScatter();
  GradientScatter(const GradientScatter&) = delete;
  GradientScatter& operator=(const GradientScatter&) = delete;

  /// Before the step's backward: drops every .grad (a leftover counts as nothing, as zeroing it
  /// would), zeroes the slice and arms the hooks.
  void begin_step();
  /// After the step's backward: disarms, sends every gradient not yet sent (agreeing with the
  /// other ranks which buckets those are), runs `posted` once everything is posted (the fault
  /// point), waits with deadline and leaves the slice holding the group's average. Collective.
  void reduce(std::int64_t step, const std::function<void()>& posted);
  std::size_t bucket_count() const { return buckets_.size(); }
  /// Bucket sends this step (in the backward's hooks / in reduce()), for tests and the log.
  std::int64_t sent_in_backward() const { return sent_in_backward_; }
  std::int64_t sent_after_backward() const { return sent_after_backward_; }
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Bucket {
    std::vector<std::size_t> params;
    std::int64_t begin = 0, end = 0;  ///< flat elements
    std::vector<int> counts;          ///< elements each group rank receives
    std::int64_t at = 0;              ///< where this rank's part starts in its slice
    std::vector<char> seen;           ///< which parameters got a gradient since the last send
    std::size_t seen_count = 0;
    int sends = 0;                    ///< this step
  };
  struct InFlight {
    std::unique_ptr<comm::ShardCollectives::Pending> pending;
    torch::Tensor send, recv;
    std::int64_t at = 0;
  };

  void on_ready(std::size_t param);
  /// bf16-mixed: the compute copy's grad added into the master's .grad, then dropped (pack()).
  void fold(std::size_t param);
  /// Packs the bucket's grads into a buffer on the collectives' device (zeros for a missing one)
  /// and drops them.
  torch::Tensor pack(Bucket& bucket);
  void post(std::size_t b, torch::Tensor send);
  /// Adds what finished into the slice and frees its buffers (testing MPI's requests is also
  /// MPI's progress).
  void progress();
  void collect(InFlight& f);
  std::vector<int> agree(std::int64_t step);

  MPI_Comm comm_;
  std::shared_ptr<comm::ShardCollectives> collectives_;
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> sources_;
  std::vector<std::int64_t> numels_;  ///< each parameter's elements (held or not)
  Layout layout_;
  torch::Tensor slice_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;
  std::vector<compat::GradReadyHook> hooks_;
  std::vector<InFlight> flight_;
  std::vector<std::pair<std::size_t, torch::Tensor>> staged_;  ///< packed off the main thread
  std::thread::id main_thread_;
  bool armed_ = false;
  std::int64_t sent_in_backward_ = 0, sent_after_backward_ = 0;
  double wait_seconds_ = 0;
  std::chrono::duration<double> timeout_;
  int world_rank_;
  std::vector<int> peers_;
  comm::HealthChannel* health_;
};

}  // namespace wd::student
