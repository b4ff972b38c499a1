// The CUDA copy engine of teacher.placement = stream: pinned staging, a side stream, events.
// Compiled whenever the CUDA toolkit is found (raw CUDA runtime only), so CPU builds check it.
#include <optional>

#include "comm/cuda_check.hpp"
#include "core/errors.hpp"
#include "core/torch_compat.hpp"
#include "teacher/block_streamer.hpp"
#include "teacher/copy_worker.hpp"

namespace wd::teacher {

namespace {

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
        worker_(std::in_place, slots, timeout_s, "the staging of a block",
                [this](std::size_t slot, Copies& copies) { stage_and_upload(slot, copies); }) {
    WD_CHECK_CUDA(cudaSetDevice(device_));
    WD_CHECK_CUDA(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    for (auto& s : slots_) {
      WD_CHECK_CUDA(cudaEventCreateWithFlags(&s.uploaded, cudaEventDisableTiming));
      WD_CHECK_CUDA(cudaEventCreateWithFlags(&s.read, cudaEventDisableTiming));
    }
  }

  ~CudaCopyEngine() override {
    worker_.reset();  // joins: no upload is queued after this
    // Never throws: a failed teardown only leaks what the process is about to drop anyway.
    cudaStreamSynchronize(copy_stream_);
    for (auto& s : slots_) {
      if (s.staging) cudaFreeHost(s.staging);
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
    }
    if (s.staging_bytes < bytes) {
      if (s.staging) WD_CHECK_CUDA(cudaFreeHost(s.staging));
      s.staging = nullptr;
      WD_CHECK_CUDA(cudaHostAlloc(&s.staging, bytes, cudaHostAllocDefault));
      s.staging_bytes = bytes;
    }
    torch::NoGradGuard no_grad;
    auto* at = static_cast<std::uint8_t*>(s.staging);
    for (const auto& [dst, src] : copies) {
      // Convert on the host into pinned memory; the device copy is then a plain DMA.
      auto staged = torch::from_blob(at, dst.sizes(), torch::TensorOptions().dtype(dst.scalar_type()));
      staged.copy_(src);
      at += staged.numel() * staged.element_size();
    }
    // The slot's device buffer is overwritten only after the compute that last read it.
    WD_CHECK_CUDA(cudaStreamWaitEvent(copy_stream_, s.read, 0));
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
  bool device_set_ = false;  ///< touched by the worker thread only
  std::optional<CopyWorker> worker_;  ///< last: its thread uses everything above
};

}  // namespace

std::unique_ptr<CopyEngine> make_cuda_copy_engine(std::size_t slots, const c10::Device& device,
                                                  double timeout_s) {
  return std::make_unique<CudaCopyEngine>(slots, device, timeout_s);
}

}  // namespace wd::teacher
