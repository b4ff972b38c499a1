// ShardCollectives: the reduce-scatter and all-gather that ZeRO's shards (student.shard) run over
// the student group, started asynchronously and waited for with the project's deadline. Two
// backends behind one interface, chosen as the gradient all-reduce's is (comm.backend): MPI over
// host buffers, and NCCL over the GPUs' own memory for GPU students of distinct GPUs. The code
// above the collectives (the buckets, the slices, the hooks) is the same for both.
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <vector>

#include "comm/wait.hpp"
#include "core/choices.hpp"

namespace wd::comm {

class HealthChannel;

class ShardCollectives {
 public:
  /// One collective in flight. The caller keeps its buffers until it is done (or, abandoned after
  /// a failure, until the process exits: comm::keep_until_exit).
  class Pending {
   public:
    virtual ~Pending() = default;
    /// True once the collective has completed on this rank; never blocks.
    virtual bool done() = 0;
  };

  virtual ~ShardCollectives() = default;

  /// Where the collectives' buffers must be: the host (MPI) or this rank's GPU (NCCL).
  virtual c10::Device buffer_device() const = 0;
  /// Whether a collective may be started from another thread than the one that made this object
  /// (the autograd engine's device thread, in a gradient hook). MPI: no, it is funneled.
  virtual bool posts_from_any_thread() const = 0;
  /// Starts a reduce-scatter: every rank's `send` (fp32, the sum of `counts` elements) is summed,
  /// and group rank r receives the sum's elements [counts[0] + … + counts[r−1], … + counts[r]) in
  /// `recv` (counts[r] elements). Every rank passes the same counts; a count may be 0.
  virtual std::unique_ptr<Pending> reduce_scatter(const torch::Tensor& send, const torch::Tensor& recv,
                                                  const std::vector<int>& counts) = 0;
  /// Starts an all-gather: group rank r's `send` (counts[r] fp32 elements) lands in every rank's
  /// `recv` at element displs[r]. `send` may be this rank's own part of `recv` (in place).
  virtual std::unique_ptr<Pending> all_gather(const torch::Tensor& send, const torch::Tensor& recv,
                                              const std::vector<int>& counts, const std::vector<int>& displs) = 0;
  /// Waits for every one of `pending` until `timeout` has passed, polling the health channel;
  /// throws TimeoutError naming `info`, or the failure reported elsewhere.
  virtual void wait_all(const std::vector<Pending*>& pending, const WaitInfo& info,
                        std::chrono::duration<double> timeout) = 0;
  /// "mpi" or "nccl".
  virtual const char* backend() const = 0;
};

/// The MPI backend over `students` (not owned: it must outlive the object): MPI_Ireduce_scatter
/// and MPI_Iallgatherv of host buffers. Not collective.
std::shared_ptr<ShardCollectives> make_mpi_shard_collectives(MPI_Comm students, int world_rank,
                                                             HealthChannel* health);

/// The NCCL backend for tensors on `device` (defined where the build has the NCCL transport;
/// elsewhere it throws ConfigError, and make_shard_collectives never asks for it there).
/// Collective over `students`.
std::shared_ptr<ShardCollectives> make_nccl_shard_collectives(MPI_Comm students, const c10::Device& device,
                                                              double timeout_s, int world_rank,
                                                              HealthChannel* health);

/// The backend for a student group whose parameters sit on `device`: NCCL where `backend` and
/// the group's devices allow it (every rank on a GPU of its own, a build with NCCL), else MPI
/// (comm::choose_backend's rule, logged once by the group's first rank). Collective over
/// `students`.
std::shared_ptr<ShardCollectives> make_shard_collectives(MPI_Comm students, const c10::Device& device,
                                                         CommBackend backend, double timeout_s, int world_rank,
                                                         HealthChannel* health);

}  // namespace wd::comm
