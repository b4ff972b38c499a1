// NcclComm, the CUDA stream/event owners and the NCCL/CUDA error formatters.
#include "comm/nccl_comm.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>

#include "comm/mpi_check.hpp"
#include "comm/startup.hpp"

namespace wd::comm {

namespace {

/// How long the destructor lets ncclCommFinalize settle before it aborts instead: a teardown
/// must not hang on a peer that has gone.
constexpr std::chrono::seconds kFinalizeGrace{5};

std::string rank_text() {
  const int rank = current_world_rank();
  return rank >= 0 ? std::to_string(rank) : std::string("?");
}

}  // namespace

std::string nccl_error_message(ncclResult_t rc, const char* call, const char* file, int line,
                               ncclComm_t comm) {
  std::string text = std::string(call) + " failed: " + ncclGetErrorString(rc);
  // The last error carries NCCL's own detail ("Cuda failure 'out of memory'", a socket error).
  const char* last = ncclGetLastError(comm);
  if (last && *last) text += std::string(" [") + last + "]";
  return text + " " + call_site(file, line);
}

int visible_cuda_devices() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear it: a later caller should see its own error, not this one
    return 0;
  }
  return count;
}

int require_cuda_devices() {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0) {
    const std::string why = rc != cudaSuccess ? std::string(cudaGetErrorString(rc))
                                              : std::string("0 devices");
    cudaGetLastError();
    throw CudaError("NCCL transport: no CUDA device visible on rank " + rank_text() +
                    " (cudaGetDeviceCount: " + why + ")");
  }
  return count;
}

CudaDeviceGuard::CudaDeviceGuard(int device) {
  WD_CHECK_CUDA(cudaGetDevice(&previous_));
  if (previous_ != device) WD_CHECK_CUDA(cudaSetDevice(device));
}

CudaDeviceGuard::~CudaDeviceGuard() {
  int now = -1;
  if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) {
    cudaSetDevice(previous_);
  }
}

CudaStream::CudaStream(int device) {
  CudaDeviceGuard guard(device);
  WD_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaStream::~CudaStream() {
  if (stream_) cudaStreamDestroy(stream_);  // returns at once; pending work still completes
}

CudaStream::CudaStream(CudaStream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

CudaEvent::CudaEvent(int device, bool timing) {
  CudaDeviceGuard guard(device);
  WD_CHECK_CUDA(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() {
  if (event_) cudaEventDestroy(event_);
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    if (event_) cudaEventDestroy(event_);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void CudaEvent::record(cudaStream_t stream) { WD_CHECK_CUDA(cudaEventRecord(event_, stream)); }

void CudaEvent::block(cudaStream_t stream) const {
  WD_CHECK_CUDA(cudaStreamWaitEvent(stream, event_, 0));
}

NcclComm::NcclComm(MPI_Comm comm, int device, double timeout_s, HealthChannel* health)
    : device_(device), world_rank_(current_world_rank()), timeout_(timeout_s), health_(health) {
  WD_CHECK(comm != MPI_COMM_NULL, "NCCL communicator on rank " << world_rank_
                                                               << " from MPI_COMM_NULL");
  WD_CHECK_MPI(MPI_Comm_rank(comm, &rank_));
  WD_CHECK_MPI(MPI_Comm_size(comm, &size_));
  world_ranks_ = world_ranks_of(comm);

  // Every rank checks its GPU first and all agree on the verdict, so a rank without one stops
  // the others at once instead of leaving them to time out waiting for the unique id.
  // Rank 0's unique id is made inside the same agreement, so its failure is reported too.
  ncclUniqueId id{};
  std::exception_ptr problem;
  try {
    const int count = require_cuda_devices();
    WD_CHECK_AS(ConfigError, device >= 0 && device < count,
                "NCCL transport: CUDA device " << device << " requested on rank " << world_rank_
                                               << ", which sees " << count << " device(s)");
    if (rank_ == 0) WD_CHECK_NCCL(ncclGetUniqueId(&id));
  } catch (...) {
    problem = std::current_exception();
  }
  agree_on_startup("NCCL communicator set-up", problem, comm, timeout_s, health_);

  static_assert(sizeof(ncclUniqueId) % sizeof(std::int64_t) == 0, "the id travels as int64s");
  std::vector<std::int64_t> words(sizeof(ncclUniqueId) / sizeof(std::int64_t));
  std::memcpy(words.data(), &id, sizeof id);
  broadcast_ints(words, 0, comm, timeout_s, "NCCL unique id", health_);
  std::memcpy(&id, words.data(), sizeof id);

  CudaDeviceGuard guard(device_);
  // Non-blocking initialisation: a peer that never joins shows up as a timeout here (polled
  // with the health channel) instead of a call that never returns.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t rc = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    const std::string what = nccl_error_message(rc, "ncclCommInitRankConfig", __FILE__, __LINE__, comm_);
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw NcclError(what);
  }
  const WaitInfo info{"NCCL communicator init", -1, sizeof id, peers()};
  try {
    poll([] { return true; }, info, timeout_);
  } catch (...) {
    release();
    throw;
  }
}

NcclComm::~NcclComm() { release(); }

NcclComm::NcclComm(NcclComm&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)),
      rank_(other.rank_),
      size_(other.size_),
      device_(other.device_),
      world_rank_(other.world_rank_),
      world_ranks_(std::move(other.world_ranks_)),
      timeout_(other.timeout_),
      health_(other.health_),
      failed_(other.failed_),
      open_groups_(std::exchange(other.open_groups_, 0)),
      streams_(std::move(other.streams_)) {}

NcclComm& NcclComm::operator=(NcclComm&& other) noexcept {
  if (this != &other) {
    release();
    comm_ = std::exchange(other.comm_, nullptr);
    rank_ = other.rank_;
    size_ = other.size_;
    device_ = other.device_;
    world_rank_ = other.world_rank_;
    world_ranks_ = std::move(other.world_ranks_);
    timeout_ = other.timeout_;
    health_ = other.health_;
    failed_ = other.failed_;
    open_groups_ = std::exchange(other.open_groups_, 0);
    streams_ = std::move(other.streams_);
  }
  return *this;
}

std::vector<int> NcclComm::peers() const {
  std::vector<int> out;
  for (const int r : world_ranks_) {
    if (r != world_rank_) out.push_back(r);
  }
  return out;
}

template <typename Query>
void NcclComm::poll(Query done, const WaitInfo& info, std::chrono::duration<double> timeout) {
  const bool finished = poll_until(timeout, [&] {
    WD_CHECK(comm_ && !failed_, info.op << " of step " << info.step << " on rank " << world_rank_
                                        << ": the NCCL communicator was aborted after an earlier "
                                           "failure");
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      const std::string what =
          nccl_error_message(rc != ncclSuccess ? rc : state, "ncclCommGetAsyncError", __FILE__,
                             __LINE__, comm_) +
          " during " + info.op + " of step " + std::to_string(info.step);
      abort();
      throw NcclError(what);
    }
    try {
      if (state == ncclSuccess && done()) return true;
      watch_health(health_, info.op);
    } catch (...) {
      // A failed query, or another rank failed: our peer may never post its half of the
      // operation, so nothing of ours may stay blocked in a kernel waiting for it.
      abort();
      throw;
    }
    return false;
  });
  if (!finished) {
    abort();
    throw_timeout(info, timeout, world_rank_, info.peers.empty() ? peers() : info.peers);
  }
}

void NcclComm::wait(cudaEvent_t event, const WaitInfo& info, std::chrono::duration<double> timeout) {
  poll(
      [&] {
        const cudaError_t rc = cudaEventQuery(event);
        if (rc == cudaErrorNotReady) return false;
        WD_CHECK_CUDA(rc);
        return true;
      },
      info, timeout);
}

void NcclComm::wait(cudaStream_t stream, const WaitInfo& info,
                    std::chrono::duration<double> timeout) {
  poll(
      [&] {
        const cudaError_t rc = cudaStreamQuery(stream);
        if (rc == cudaErrorNotReady) return false;
        WD_CHECK_CUDA(rc);
        return true;
      },
      info, timeout);
}

void NcclComm::enqueued(ncclResult_t rc, const char* call, const char* file, int line) {
  if (rc == ncclSuccess) return;
  if (rc == ncclInProgress) {
    // A non-blocking communicator is still enqueuing; NCCL wants its state polled to success
    // before the next call.
    poll([] { return true; }, WaitInfo{call, -1, 0, peers()}, timeout_);
    return;
  }
  const std::string what = nccl_error_message(rc, call, file, line, comm_);
  abort();
  throw NcclError(what);
}

void NcclComm::note_stream(cudaStream_t stream) {
  if (std::find(streams_.begin(), streams_.end(), stream) == streams_.end()) streams_.push_back(stream);
}

void NcclComm::group_start() {
  WD_CHECK_NCCL(ncclGroupStart());
  ++open_groups_;
}

void NcclComm::group_end() {
  if (open_groups_ == 0) return;  // abort() closed it already
  --open_groups_;
  enqueued(ncclGroupEnd(), "ncclGroupEnd", __FILE__, __LINE__);
}

void NcclComm::abandon_group() noexcept {
  if (open_groups_ > 0) {
    --open_groups_;
    ncclGroupEnd();
  }
  abort();
}

void NcclComm::send(const void* data, std::size_t bytes, int peer, cudaStream_t stream) {
  WD_CHECK(!failed_, "ncclSend to rank " << peer << " on rank " << world_rank_
                                         << ": the communicator was aborted");
  note_stream(stream);
  enqueued(ncclSend(data, bytes, ncclUint8, peer, comm_, stream), "ncclSend", __FILE__, __LINE__);
}

void NcclComm::recv(void* data, std::size_t bytes, int peer, cudaStream_t stream) {
  WD_CHECK(!failed_, "ncclRecv from rank " << peer << " on rank " << world_rank_
                                           << ": the communicator was aborted");
  note_stream(stream);
  enqueued(ncclRecv(data, bytes, ncclUint8, peer, comm_, stream), "ncclRecv", __FILE__, __LINE__);
}

void NcclComm::broadcast(const void* send, void* recv, std::size_t bytes, int root,
                         cudaStream_t stream) {
  WD_CHECK(!failed_, "ncclBroadcast from rank " << root << " on rank " << world_rank_
                                                << ": the communicator was aborted");
  note_stream(stream);
  enqueued(ncclBroadcast(send, recv, bytes, ncclUint8, root, comm_, stream), "ncclBroadcast",
           __FILE__, __LINE__);
}

void NcclComm::all_reduce_sum(float* data, std::size_t count, cudaStream_t stream) {
  WD_CHECK(!failed_, "ncclAllReduce on rank " << world_rank_ << ": the communicator was aborted");
  note_stream(stream);
  enqueued(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream), "ncclAllReduce",
           __FILE__, __LINE__);
}

void NcclComm::reduce_sum(const float* send, float* recv, std::size_t count, int root, cudaStream_t stream) {
  WD_CHECK(!failed_, "ncclReduce to rank " << root << " on rank " << world_rank_ << ": the communicator was aborted");
  note_stream(stream);
  enqueued(ncclReduce(send, recv, count, ncclFloat32, ncclSum, root, comm_, stream), "ncclReduce", __FILE__,
           __LINE__);
}

void NcclComm::reduce_scatter_sum(const float* send, float* recv, std::size_t count, cudaStream_t stream) {
  WD_CHECK(!failed_, "ncclReduceScatter on rank " << world_rank_ << ": the communicator was aborted");
  note_stream(stream);
  enqueued(ncclReduceScatter(send, recv, count, ncclFloat32, ncclSum, comm_, stream), "ncclReduceScatter",
           __FILE__, __LINE__);
}

void NcclComm::all_gather(const float* send, float* recv, std::size_t count, cudaStream_t stream) {
  WD_CHECK(!failed_, "ncclAllGather on rank " << world_rank_ << ": the communicator was aborted");
  note_stream(stream);
  enqueued(ncclAllGather(send, recv, count, ncclFloat32, comm_, stream), "ncclAllGather", __FILE__, __LINE__);
}

void NcclComm::abort() noexcept {
  // Aborting inside an open group is undefined: end it first (NCCL drops a group whose
  // operations failed to enqueue; the abort stops whatever it launched).
  for (; open_groups_ > 0; --open_groups_) ncclGroupEnd();
  if (!comm_ || failed_) return;
  failed_ = true;
  ncclCommAbort(comm_);
  comm_ = nullptr;
}

void NcclComm::release() noexcept {
  for (; open_groups_ > 0; --open_groups_) ncclGroupEnd();  // never destroy inside a group
  if (!comm_) return;
  bool quiet = !failed_;
  for (const cudaStream_t s : streams_) quiet = quiet && cudaStreamQuery(s) == cudaSuccess;
  ncclResult_t state = ncclSuccess;
  quiet = quiet && ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclSuccess;
  if (quiet && ncclCommFinalize(comm_) != ncclSuccess) {
    // Non-blocking: ncclInProgress until the flush is done. Bounded, see kFinalizeGrace.
    const auto deadline = std::chrono::steady_clock::now() + kFinalizeGrace;
    for (;;) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) {
        quiet = false;
        break;
      }
      if (state != ncclInProgress) {
        quiet = state == ncclSuccess;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        quiet = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (quiet) {
    ncclCommDestroy(comm_);
  } else {
    ncclCommAbort(comm_);
  }
  comm_ = nullptr;
}

}  // namespace wd::comm
