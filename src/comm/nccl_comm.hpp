// NcclComm (RAII NCCL communicator made over MPI), CudaStream and CudaEvent owners, the
// WD_CHECK_NCCL macro (WD_CHECK_CUDA is in cuda_check.hpp) and the NCCL deadline wait. Torch-free: compiled whenever
// the CUDA toolkit and NCCL are found (WD_HAVE_NCCL), whatever LibTorch was built with.
#pragma once

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/cuda_check.hpp"
#include "comm/group_guard.hpp"
#include "comm/wait.hpp"
#include "core/errors.hpp"

namespace wd::comm {

/// Formats a failed NCCL call: "<call> failed: <ncclGetErrorString> [<ncclGetLastError>]
/// (rank R, at file:line)". `comm` may be null.
std::string nccl_error_message(ncclResult_t rc, const char* call, const char* file, int line,
                               ncclComm_t comm = nullptr);

}  // namespace wd::comm

/// Throws wd::NcclError naming the call, NCCL's error string, the rank and file:line.
#define WD_CHECK_NCCL(call)                                                                     \
  do {                                                                                          \
    const ncclResult_t wd_nccl_rc_ = (call);                                                    \
    if (wd_nccl_rc_ != ncclSuccess) {                                                           \
      throw ::wd::NcclError(                                                                    \
          ::wd::comm::nccl_error_message(wd_nccl_rc_, #call, __FILE__, __LINE__));              \
    }                                                                                           \
  } while (0)


namespace wd::comm {

/// CUDA devices this process sees; 0 when none (or no driver). Never throws.
int visible_cuda_devices() noexcept;

/// Like visible_cuda_devices, but throws wd::CudaError "NCCL transport: no CUDA device visible
/// on rank R (cudaGetDeviceCount: <error string>)" when there is none.
int require_cuda_devices();

/// Makes `device` current for a scope and restores the previous one (torch keeps its own idea
/// of the current device; we must not change it behind its back).
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

/// Owns a cudaStream_t created with cudaStreamNonBlocking (no implicit sync with the legacy
/// default stream, which torch's kernels may use). Move-only.
class CudaStream {
 public:
  explicit CudaStream(int device);
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

/// Owns a cudaEvent_t (timing disabled unless asked: cheaper to record and query). Move-only.
class CudaEvent {
 public:
  explicit CudaEvent(int device, bool timing = false);
  ~CudaEvent();
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }
  void record(cudaStream_t stream);
  /// Makes `stream` wait (on the device) for the work this event recorded.
  void block(cudaStream_t stream) const;

 private:
  cudaEvent_t event_ = nullptr;
};

/// One NCCL communicator over the ranks of an MPI communicator. Made collectively: rank 0 of
/// `comm` creates the ncclUniqueId, MPI broadcasts it (with deadline) and every rank runs a
/// non-blocking ncclCommInitRankConfig on `device`, polled with the same deadline. Every wait
/// polls the stream/event, ncclCommGetAsyncError and the health channel it was made with; a
/// timeout, an
/// asynchronous NCCL error or a failure elsewhere aborts the communicator (ncclCommAbort) before
/// the exception leaves, so no rank stays blocked in a kernel waiting for a dead peer.
/// Move-only. Streams passed to its operations must outlive it (the destructor queries them).
class NcclComm {
 public:
  /// Collective over `comm`. Throws CudaError when no GPU is visible (agreed on by every rank
  /// of `comm`, so none is left waiting for the unique id), NcclError, or TimeoutError. Every
  /// wait, from set-up on, polls `health` (null: none, as in tests and benchmarks).
  NcclComm(MPI_Comm comm, int device, double timeout_s, HealthChannel* health);
  /// Never throws. Aborts when the communicator failed or work it enqueued is still pending
  /// (ncclCommDestroy would wait for it, maybe forever); otherwise finalizes, with a bounded
  /// wait, and destroys.
  ~NcclComm();
  NcclComm(NcclComm&& other) noexcept;
  NcclComm& operator=(NcclComm&& other) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  ncclComm_t get() const { return comm_; }
  /// World rank of communicator rank `r` (for messages).
  int world_rank_of(int r) const { return world_ranks_.at(static_cast<std::size_t>(r)); }
  bool aborted() const { return failed_; }

  /// ncclGroupStart: the point-to-point calls up to group_end are fused (required for a
  /// send-to-self and for several sends that must not serialise).
  void group_start();
  /// ncclGroupEnd; a non-blocking communicator may still be enqueuing: polled with deadline.
  void group_end();
  /// An exception left an open group: ncclGroupEnd (errors ignored), then abort(), since part
  /// of the group's operations may have reached the peers. Never throws.
  void abandon_group() noexcept;
  /// group_start now; the guard's end() is group_end, and its destructor abandon_group when an
  /// exception leaves the scope first (so no group stays open on the thread).
  auto group() {
    return GroupGuard([this] { group_start(); }, [this] { group_end(); },
                      [this]() noexcept { abandon_group(); });
  }
  void send(const void* data, std::size_t bytes, int peer, cudaStream_t stream);
  void recv(void* data, std::size_t bytes, int peer, cudaStream_t stream);
  /// ncclBroadcast of `bytes` from `root`'s `send` into every rank's `recv` (may alias).
  void broadcast(const void* send, void* recv, std::size_t bytes, int root, cudaStream_t stream);
  /// In-place sum of `count` floats over all ranks.
  void all_reduce_sum(float* data, std::size_t count, cudaStream_t stream);
  /// ncclReduce: the sum of every rank's `count` floats at `send` into `root`'s `recv` (ignored
  /// on the other ranks).
  void reduce_sum(const float* send, float* recv, std::size_t count, int root, cudaStream_t stream);
  /// ncclReduceScatter: rank r receives the sum's floats [r·count, (r+1)·count) in `recv`.
  void reduce_scatter_sum(const float* send, float* recv, std::size_t count, cudaStream_t stream);
  /// ncclAllGather: rank r's `count` floats land at recv + r·count on every rank (in place when
  /// `send` is that part of `recv`).
  void all_gather(const float* send, float* recv, std::size_t count, cudaStream_t stream);

  /// Waits until `event` completed, with deadline; see the class comment.
  void wait(cudaEvent_t event, const WaitInfo& info, std::chrono::duration<double> timeout);
  /// Waits until all work on `stream` completed, with deadline.
  void wait(cudaStream_t stream, const WaitInfo& info, std::chrono::duration<double> timeout);

  /// ncclCommAbort now (idempotent, never throws): kernels of this communicator return and
  /// every later operation fails. Used on any failure path.
  void abort() noexcept;

 private:
  template <typename Query>
  void poll(Query query, const WaitInfo& info, std::chrono::duration<double> timeout);
  /// Checks an enqueue call's result; ncclInProgress (non-blocking communicator) is polled.
  void enqueued(ncclResult_t rc, const char* call, const char* file, int line);
  void note_stream(cudaStream_t stream);
  void release() noexcept;
  /// Peers of this rank (world ranks), for timeout messages.
  std::vector<int> peers() const;

  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 0;
  int device_ = -1;
  int world_rank_ = -1;
  std::vector<int> world_ranks_;
  std::chrono::duration<double> timeout_{0};
  HealthChannel* health_ = nullptr;
  bool failed_ = false;
  int open_groups_ = 0;  ///< group_start calls not yet ended (NCCL's depth is per thread)
  std::vector<cudaStream_t> streams_;  ///< streams that carried this communicator's work
};

}  // namespace wd::comm
