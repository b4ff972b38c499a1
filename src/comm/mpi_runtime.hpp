// MpiRuntime (RAII owner of MPI_Init/Finalize) and the MPI deadline waits.
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/mpi_check.hpp"
#include "comm/wait.hpp"
#include "core/errors.hpp"
#include "core/topology.hpp"

namespace wd::comm {

/// Owns MPI for the life of main: initialises (MPI_THREAD_FUNNELED), sets MPI_ERRORS_RETURN on
/// MPI_COMM_WORLD so failures become exceptions, finalizes in the destructor. Move-only.
/// Lives in main's scope, never in a static.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  MpiRuntime(MpiRuntime&& other) noexcept;
  MpiRuntime& operator=(MpiRuntime&&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// Rank and count among the processes of this node (MPI_COMM_TYPE_SHARED).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  /// After a failure: MPI_Abort instead of MPI_Finalize (the destructor then does nothing).
  [[noreturn]] void abort(int code);
  /// After a failure handled by every rank: flushes the logs and leaves with `code` without
  /// MPI_Finalize (which waits for every rank, including a dead one).
  [[noreturn]] void exit_without_finalize(int code);

 private:
  bool owner_ = true;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

/// Polls MPI_Test on `request` until it completes or `timeout` passes (then throws
/// TimeoutError), on poll_until's backoff (≤ 1 ms) so waiting ranks do not burn a core that
/// others share. Each poll also checks `health` (null before training), so a wait ends with
/// PeerFailure / Interrupted as soon as another rank fails or a stop signal arrives.
void wait_with_deadline(MPI_Request& request, const WaitInfo& info, std::chrono::duration<double> timeout,
                        int my_rank, HealthChannel* health);
/// Same for several requests (MPI_Testall).
void wait_all_with_deadline(std::vector<MPI_Request>& requests, const WaitInfo& info,
                            std::chrono::duration<double> timeout, int my_rank, HealthChannel* health);

/// Cancels every pending request of `requests` and lets them settle for a short grace (200 ms);
/// never throws or blocks longer. Returns false when some request could not be settled: it is
/// then detached (MPI_Request_free; Open MPI cannot cancel a send nobody matches), and its
/// buffer must outlive the process's use of MPI (keep_until_exit).
bool cancel_and_settle(std::vector<MPI_Request*> requests) noexcept;

/// Keeps `buffer` alive until the process exits. A request abandoned after a failure (an
/// all-reduce a dead peer never joins) may still be written by MPI's progress engine, so its
/// buffer must never be freed.
void keep_until_exit(const torch::Tensor& buffer) noexcept;

}  // namespace wd::comm
