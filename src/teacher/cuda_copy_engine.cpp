// The CUDA copy engines of teacher.placement = stream (from the pinned arena: one DMA per block;
// from the mapped checkpoint: pinned staging on copy threads), a side stream, events; the host
// registration of the arena and the H2D bandwidth probe. Compiled whenever the CUDA toolkit is
// found (raw CUDA runtime only), so CPU builds check it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>

#include "comm/cuda_check.hpp"
#include "core/errors.hpp"
#include "core/torch_compat.hpp"
#include "teacher/block_streamer.hpp"
#include "teacher/copy_worker.hpp"
#include "teacher/cuda_host.hpp"

namespace wd::teacher {

namespace {

/// Per slot: a pinned staging buffer, the event marking its upload done, and the event marking
/// the compute that read the slot done. A worker thread converts host tensors into the staging
/// buffer (page faults on a cold mapping happen there, off the compute thread) and queues the
/// upload on the copy stream after the slot's last reader.
class CudaCopyEngine final : public CopyEngine {
 public:
  CudaCopyEngine(std::size_t slots, const c10::Device& device, double timeout_s, int threads)
      : device_(device.index() < 0 ? 0 : device.index()),
        compute_stream_(static_cast<cudaStream_t>(compat::current_cuda_stream(device))),
        slots_(slots),
        threads_(threads),
        worker_(std::in_place, slots, timeout_s, "the staging of a block",
                [this](std::size_t slot, Copies& copies) { stage_and_upload(slot, copies); }) {
    WD_CHECK_CUDA(cudaSetDevice(device_));
    WD_CHECK_CUDA(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    for (auto& s : slots_) {
      WD_CHECK_CUDA(cudaEventCreate(&s.begin));  // begin and uploaded time the upload
      WD_CHECK_CUDA(cudaEventCreate(&s.uploaded));
      WD_CHECK_CUDA(cudaEventCreateWithFlags(&s.read, cudaEventDisableTiming));
    }
  }

  CopyStats stats() const override {
    return {1e-9 * static_cast<double>(staging_ns_.load()), 1e-6 * static_cast<double>(upload_us_.load()),
            uploads_timed_.load()};
  }

  ~CudaCopyEngine() override {
    worker_.reset();  // joins: no upload is queued after this
    // Never throws: a failed teardown only leaks what the process is about to drop anyway.
    cudaStreamSynchronize(copy_stream_);
    for (auto& s : slots_) {
      if (s.staging) cudaFreeHost(s.staging);
      cudaEventDestroy(s.begin);
      cudaEventDestroy(s.uploaded);
      cudaEventDestroy(s.read);
    }
    cudaStreamDestroy(copy_stream_);
  }

  void start(std::size_t slot, Copies copies) override { worker_->start(slot, std::move(copies)); }

  void wait(std::size_t slot) override {
    worker_->wait(slot);  // the upload is queued on the copy stream
    // The compute stream waits on the device, the host does not.
    WD_CHECK_CUDA(cudaStreamWaitEvent(compute_stream_, slots_.at(slot).uploaded, 0));
  }

  void release(std::size_t slot) override {
    WD_CHECK_CUDA(cudaEventRecord(slots_.at(slot).read, compute_stream_));
  }

 private:
  struct Slot {
    void* staging = nullptr;
    std::size_t staging_bytes = 0;
    cudaEvent_t begin = nullptr;
    cudaEvent_t uploaded = nullptr;
    cudaEvent_t read = nullptr;
    bool used = false;  ///< `uploaded` has been recorded once
  };

  /// On the worker thread: convert into the slot's pinned staging buffer, then queue the upload.
  void stage_and_upload(std::size_t slot, Copies& copies) {
    if (!device_set_) {  // the CUDA device is per thread
      WD_CHECK_CUDA(cudaSetDevice(device_));
      device_set_ = true;
    }
    auto& s = slots_[slot];
    std::size_t bytes = 0;
    for (const auto& [dst, src] : copies) bytes += dst.numel() * dst.element_size();
    if (s.used) {
      // The staging buffer is rewritten below: its previous upload must be over (long since).
      WD_CHECK_CUDA(cudaEventSynchronize(s.uploaded));
      float ms = 0;
      WD_CHECK_CUDA(cudaEventElapsedTime(&ms, s.begin, s.uploaded));
      upload_us_ += static_cast<std::int64_t>(1e3 * ms);
      ++uploads_timed_;
    }
    const auto staging_start = std::chrono::steady_clock::now();
    if (s.staging_bytes < bytes) {
      if (s.staging) WD_CHECK_CUDA(cudaFreeHost(s.staging));
      s.staging = nullptr;
      WD_CHECK_CUDA(cudaHostAlloc(&s.staging, bytes, cudaHostAllocDefault));
      s.staging_bytes = bytes;
    }
    // Convert on the host into pinned memory, on the copy threads; the device copy is then a
    // plain DMA.
    Copies staged;
    auto* at = static_cast<std::uint8_t*>(s.staging);
    for (const auto& [dst, src] : copies) {
      staged.emplace_back(torch::from_blob(at, dst.sizes(), torch::TensorOptions().dtype(dst.scalar_type())), src);
      at += dst.numel() * dst.element_size();
    }
    parallel_copy(staged, threads_);
    staging_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - staging_start).count();
    // The slot's device buffer is overwritten only after the compute that last read it.
    WD_CHECK_CUDA(cudaStreamWaitEvent(copy_stream_, s.read, 0));
    WD_CHECK_CUDA(cudaEventRecord(s.begin, copy_stream_));
    at = static_cast<std::uint8_t*>(s.staging);
    for (const auto& [dst, src] : copies) {
      const auto n = static_cast<std::size_t>(dst.numel() * dst.element_size());
      WD_CHECK_CUDA(cudaMemcpyAsync(dst.data_ptr(), at, n, cudaMemcpyHostToDevice, copy_stream_));
      at += n;
    }
    WD_CHECK_CUDA(cudaEventRecord(s.uploaded, copy_stream_));
    s.used = true;
  }

  int device_;
  cudaStream_t compute_stream_;
  cudaStream_t copy_stream_ = nullptr;
  std::vector<Slot> slots_;
  int threads_ = 1;
  std::atomic<std::int64_t> staging_ns_{0}, upload_us_{0}, uploads_timed_{0};  ///< written by the worker
  bool device_set_ = false;  ///< touched by the worker thread only
  std::optional<CopyWorker> worker_;  ///< last: its thread uses everything above
};

/// From pinned memory: every copy is queued on the copy stream by the calling thread, after
/// the event of the slot's last reader; the compute stream waits for the upload on the device.
/// The host never waits and copies nothing.
class CudaDirectCopyEngine final : public CopyEngine {
 public:
  CudaDirectCopyEngine(std::size_t slots, const c10::Device& device)
      : device_(device.index() < 0 ? 0 : device.index()),
        compute_stream_(static_cast<cudaStream_t>(compat::current_cuda_stream(device))),
        begin_(slots, nullptr),
        uploaded_(slots, nullptr),
        read_(slots, nullptr),
        pending_(slots, false) {
    WD_CHECK_CUDA(cudaSetDevice(device_));
    WD_CHECK_CUDA(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    for (std::size_t i = 0; i < slots; ++i) {
      WD_CHECK_CUDA(cudaEventCreate(&begin_[i]));  // begin and uploaded time the upload
      WD_CHECK_CUDA(cudaEventCreate(&uploaded_[i]));
      WD_CHECK_CUDA(cudaEventCreateWithFlags(&read_[i], cudaEventDisableTiming));
    }
  }

  CopyStats stats() const override { return {0, upload_s_, uploads_timed_}; }

  ~CudaDirectCopyEngine() override {
    // Never throws: the uploads in flight finish before the slots' buffers go.
    cudaStreamSynchronize(copy_stream_);
    for (std::size_t i = 0; i < uploaded_.size(); ++i) {
      cudaEventDestroy(begin_[i]);
      cudaEventDestroy(uploaded_[i]);
      cudaEventDestroy(read_[i]);
    }
    cudaStreamDestroy(copy_stream_);
  }

  void start(std::size_t slot, Copies copies) override {
    time_last_upload(slot);
    // An event never recorded counts as complete: the first copy into a slot waits for nothing.
    WD_CHECK_CUDA(cudaStreamWaitEvent(copy_stream_, read_.at(slot), 0));
    WD_CHECK_CUDA(cudaEventRecord(begin_[slot], copy_stream_));
    for (const auto& [dst, src] : copies) {
      WD_CHECK(dst.scalar_type() == src.scalar_type() && dst.numel() == src.numel() && src.is_contiguous(),
               "stream: a direct copy needs the destination's dtype and a contiguous source");
      WD_CHECK_CUDA(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), static_cast<std::size_t>(dst.nbytes()),
                                    cudaMemcpyHostToDevice, copy_stream_));
    }
    WD_CHECK_CUDA(cudaEventRecord(uploaded_[slot], copy_stream_));
    pending_[slot] = true;
  }

  void wait(std::size_t slot) override {
    WD_CHECK_CUDA(cudaStreamWaitEvent(compute_stream_, uploaded_.at(slot), 0));
  }

  void release(std::size_t slot) override { WD_CHECK_CUDA(cudaEventRecord(read_.at(slot), compute_stream_)); }

 private:
  int device_;
  cudaStream_t compute_stream_;
  cudaStream_t copy_stream_ = nullptr;
  /// Adds the slot's previous upload to the figures where it is over (a query: never a wait).
  void time_last_upload(std::size_t slot) {
    if (!pending_.at(slot) || cudaEventQuery(uploaded_[slot]) != cudaSuccess) return;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, begin_[slot], uploaded_[slot]) == cudaSuccess) {
      upload_s_ += 1e-3 * ms;
      ++uploads_timed_;
    }
    pending_[slot] = false;
  }

  std::vector<cudaEvent_t> begin_;
  std::vector<cudaEvent_t> uploaded_;
  std::vector<cudaEvent_t> read_;
  std::vector<bool> pending_;  ///< an upload was queued and not yet timed
  double upload_s_ = 0;
  std::int64_t uploads_timed_ = 0;
};

}  // namespace

std::unique_ptr<CopyEngine> make_cuda_copy_engine(std::size_t slots, const c10::Device& device,
                                                  double timeout_s, int threads) {
  return std::make_unique<CudaCopyEngine>(slots, device, timeout_s, std::max(1, threads));
}

std::unique_ptr<CopyEngine> make_cuda_direct_copy_engine(std::size_t slots, const c10::Device& device) {
  return std::make_unique<CudaDirectCopyEngine>(slots, device);
}

bool cuda_host_register(void* data, std::size_t bytes, std::string& why) {
  // One registration for the whole range: no copy can span two registered ranges.
  const auto rc = cudaHostRegister(data, bytes, cudaHostRegisterPortable);
  if (rc == cudaSuccess) return true;
  static_cast<void>(cudaGetLastError());  // a refused registration is not an error of later calls
  why = std::string("cudaHostRegister: ") + cudaGetErrorString(rc);
  return false;
}

void cuda_host_unregister(void* data) noexcept { static_cast<void>(cudaHostUnregister(data)); }

namespace {

/// The probe's CUDA resources, released on scope exit whatever throws.
struct ProbeBuffers {
  void* host = nullptr;
  void* device = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t begin = nullptr, end = nullptr;
  ~ProbeBuffers() {
    if (stream) cudaStreamSynchronize(stream);
    if (host) cudaFreeHost(host);
    if (device) cudaFree(device);
    if (begin) cudaEventDestroy(begin);
    if (end) cudaEventDestroy(end);
    if (stream) cudaStreamDestroy(stream);
  }
};

}  // namespace

double measure_h2d_gbps(const c10::Device& device, std::uint64_t bytes, int runs) {
  WD_CHECK_CUDA(cudaSetDevice(device.index() < 0 ? 0 : device.index()));
  ProbeBuffers b;
  WD_CHECK_CUDA(cudaHostAlloc(&b.host, bytes, cudaHostAllocDefault));
  WD_CHECK_CUDA(cudaMalloc(&b.device, bytes));
  WD_CHECK_CUDA(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
  WD_CHECK_CUDA(cudaEventCreate(&b.begin));
  WD_CHECK_CUDA(cudaEventCreate(&b.end));
  std::memset(b.host, 1, bytes);  // touched: the timing sees no first-use faults
  double best_ms = 0;
  for (int r = 0; r <= std::max(1, runs); ++r) {  // run 0 warms the path up
    WD_CHECK_CUDA(cudaEventRecord(b.begin, b.stream));
    WD_CHECK_CUDA(cudaMemcpyAsync(b.device, b.host, bytes, cudaMemcpyHostToDevice, b.stream));
    WD_CHECK_CUDA(cudaEventRecord(b.end, b.stream));
    WD_CHECK_CUDA(cudaEventSynchronize(b.end));
    float ms = 0;
    WD_CHECK_CUDA(cudaEventElapsedTime(&ms, b.begin, b.end));
    if (r > 0 && (best_ms == 0 || ms < best_ms)) best_ms = ms;
  }
  return static_cast<double>(bytes) / (best_ms * 1e-3) / 1e9;
}

}  // namespace wd::teacher
