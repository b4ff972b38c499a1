// The CUDA copy engine of teacher.placement = stream: pinned staging, a side stream, events.
// Compiled whenever the CUDA toolkit is found (raw CUDA runtime only), so CPU builds check it.
#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "core/errors.hpp"
#include "core/torch_compat.hpp"
#include "teacher/block_streamer.hpp"

namespace wd::teacher {

namespace {

void cuda_check(cudaError_t rc, const char* call, const char* file, int line) {
  if (rc == cudaSuccess) return;
  throw Error(std::string(call) + " failed: " + cudaGetErrorString(rc) + " (" + file + ":" +
              std::to_string(line) + ")");
}
#define WD_STREAM_CUDA(call) cuda_check((call), #call, __FILE__, __LINE__)

/// Per slot: a pinned staging buffer, the event marking its upload done, and the event marking
/// the compute that read the slot done. A worker thread converts host tensors into the staging
/// buffer (page faults on a cold mapping happen there, off the compute thread) and queues the
/// upload on the copy stream after the slot's last reader.
class CudaCopyEngine final : public CopyEngine {
 public:
  CudaCopyEngine(std::size_t slots, const c10::Device& device, double timeout_s)
      : device_(device.index() < 0 ? 0 : device.index()),
        compute_stream_(static_cast<cudaStream_t>(compat::current_cuda_stream(device))),
        slots_(slots),
        timeout_(timeout_s) {
    WD_STREAM_CUDA(cudaSetDevice(device_));
    WD_STREAM_CUDA(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    for (auto& s : slots_) {
      WD_STREAM_CUDA(cudaEventCreateWithFlags(&s.uploaded, cudaEventDisableTiming));
      WD_STREAM_CUDA(cudaEventCreateWithFlags(&s.read, cudaEventDisableTiming));
    }
    worker_ = std::thread([this] { run(); });
  }

  ~CudaCopyEngine() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    worker_.join();
    // Never throws: a failed teardown only leaks what the process is about to drop anyway.
    cudaStreamSynchronize(copy_stream_);
    for (auto& s : slots_) {
      if (s.staging) cudaFreeHost(s.staging);
      cudaEventDestroy(s.uploaded);
      cudaEventDestroy(s.read);
    }
    cudaStreamDestroy(copy_stream_);
  }

  void start(std::size_t slot, Copies copies) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& s = slots_.at(slot);
      WD_CHECK(s.queued_done, "stream: a copy into slot " << slot << " started before the last one was queued");
      s.queued_done = false;
      jobs_.push_back({slot, std::move(copies)});
    }
    changed_.notify_all();
  }

  void wait(std::size_t slot) override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      const bool ready = changed_.wait_for(lock, timeout_, [&] { return slots_.at(slot).queued_done || failure_; });
      if (failure_) std::rethrow_exception(failure_);
      WD_CHECK(ready, "stream: staging a block for buffer " << slot << " took longer than "
                                                           << timeout_.count() << " s (comm.timeout_s)");
    }
    // The compute stream waits on the device, the host does not.
    WD_STREAM_CUDA(cudaStreamWaitEvent(compute_stream_, slots_[slot].uploaded, 0));
  }

  void release(std::size_t slot) override {
    WD_STREAM_CUDA(cudaEventRecord(slots_.at(slot).read, compute_stream_));
  }

 private:
  struct Slot {
    void* staging = nullptr;
    std::size_t staging_bytes = 0;
    cudaEvent_t uploaded = nullptr;
    cudaEvent_t read = nullptr;
    bool queued_done = true;  ///< the worker has queued the upload (host side finished)
    bool used = false;        ///< `uploaded` has been recorded once
  };
  struct Job {
    std::size_t slot;
    Copies copies;
  };

  void run() {
    bool device_set = false;
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      std::exception_ptr failure;
      try {
        if (!device_set) {
          WD_STREAM_CUDA(cudaSetDevice(device_));
          device_set = true;
        }
        stage_and_upload(job);
      } catch (...) {
        failure = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        slots_[job.slot].queued_done = true;
        if (failure && !failure_) failure_ = failure;
      }
      changed_.notify_all();
    }
  }

  void stage_and_upload(Job& job) {
    auto& s = slots_[job.slot];
    std::size_t bytes = 0;
    for (const auto& [dst, src] : job.copies) bytes += dst.numel() * dst.element_size();
    if (s.used) {
      // The staging buffer is rewritten below: its previous upload must be over (long since).
      WD_STREAM_CUDA(cudaEventSynchronize(s.uploaded));
    }
    if (s.staging_bytes < bytes) {
      if (s.staging) WD_STREAM_CUDA(cudaFreeHost(s.staging));
      s.staging = nullptr;
      WD_STREAM_CUDA(cudaHostAlloc(&s.staging, bytes, cudaHostAllocDefault));
      s.staging_bytes = bytes;
    }
    torch::NoGradGuard no_grad;
    auto* at = static_cast<std::uint8_t*>(s.staging);
    for (const auto& [dst, src] : job.copies) {
      // Convert on the host into pinned memory; the device copy is then a plain DMA.
      auto staged = torch::from_blob(at, dst.sizes(), torch::TensorOptions().dtype(dst.scalar_type()));
      staged.copy_(src);
      at += staged.numel() * staged.element_size();
    }
    // The slot's device buffer is overwritten only after the compute that last read it.
    WD_STREAM_CUDA(cudaStreamWaitEvent(copy_stream_, s.read, 0));
    at = static_cast<std::uint8_t*>(s.staging);
    for (const auto& [dst, src] : job.copies) {
      const auto n = static_cast<std::size_t>(dst.numel() * dst.element_size());
      WD_STREAM_CUDA(cudaMemcpyAsync(dst.data_ptr(), at, n, cudaMemcpyHostToDevice, copy_stream_));
      at += n;
    }
    WD_STREAM_CUDA(cudaEventRecord(s.uploaded, copy_stream_));
    s.used = true;
  }

  int device_;
  cudaStream_t compute_stream_;
  cudaStream_t copy_stream_ = nullptr;
  std::vector<Slot> slots_;
  std::chrono::duration<double> timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> jobs_;
  std::exception_ptr failure_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<CopyEngine> make_cuda_copy_engine(std::size_t slots, const c10::Device& device,
                                                  double timeout_s) {
  return std::make_unique<CudaCopyEngine>(slots, device, timeout_s);
}

}  // namespace wd::teacher
