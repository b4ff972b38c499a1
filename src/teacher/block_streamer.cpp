// The block streamer, its host copy engine (the CPU build's stand-in for the device) and the
// worker thread both copy engines run on.
#include "teacher/block_streamer.hpp"

#include <chrono>

#include "core/errors.hpp"
#include "teacher/copy_worker.hpp"

namespace wd::teacher {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kAlign = 256;  // slot views start on cache-line and DMA-friendly offsets

/// The host as the device: the worker thread copies while the caller computes.
class HostCopyEngine final : public CopyEngine {
 public:
  HostCopyEngine(std::size_t slots, double timeout_s)
      : worker_(slots, timeout_s, "the copy of a block",
                [](std::size_t, Copies& copies) {
                  // Grad mode is per thread; the copies never need autograd.
                  torch::NoGradGuard no_grad;
                  for (auto& [dst, src] : copies) dst.copy_(src);
                }) {}

  void start(std::size_t slot, Copies copies) override { worker_.start(slot, std::move(copies)); }
  void wait(std::size_t slot) override { worker_.wait(slot); }
  void release(std::size_t) override {}  // host compute is synchronous: done when issued

 private:
  CopyWorker worker_;
};

}  // namespace

CopyWorker::CopyWorker(std::size_t slots, double timeout_s, std::string what, Run run)
    : run_(std::move(run)), what_(std::move(what)), timeout_(timeout_s), done_(slots, true) {
  thread_ = std::thread([this] { loop(); });
}

CopyWorker::~CopyWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void CopyWorker::start(std::size_t slot, CopyEngine::Copies copies) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    WD_CHECK(done_.at(slot), "stream: a copy into slot " << slot << " started before the last one finished");
    done_[slot] = false;
    jobs_.push_back({slot, std::move(copies)});
  }
  changed_.notify_all();
}

void CopyWorker::wait(std::size_t slot) {
  std::unique_lock<std::mutex> lock(mutex_);
  const bool ready = changed_.wait_for(lock, timeout_, [&] { return done_.at(slot) || failure_; });
  if (failure_) std::rethrow_exception(failure_);
  WD_CHECK(ready, "stream: " << what_ << " into buffer " << slot << " did not finish within "
                             << timeout_.count() << " s (comm.timeout_s); is the checkpoint on a stalled disk?");
}

void CopyWorker::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping with nothing queued
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    std::exception_ptr failure;
    try {
      run_(job.slot, job.copies);
    } catch (...) {
      failure = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_[job.slot] = true;
      if (failure && !failure_) failure_ = failure;
    }
    changed_.notify_all();
  }
}

std::unique_ptr<CopyEngine> make_host_copy_engine(std::size_t slots, double timeout_s) {
  return std::make_unique<HostCopyEngine>(slots, timeout_s);
}

BlockStreamer::BlockStreamer(WanDiT model, std::int64_t begin, std::int64_t end, int ahead,
                             const c10::Device& device, const std::vector<c10::ScalarType>& dtypes,
                             std::unique_ptr<CopyEngine> engine)
    : model_(std::move(model)), begin_(begin), end_(end), engine_(std::move(engine)) {
  WD_CHECK(begin >= 0 && end > begin && end <= model_->config().num_layers,
           "stream: blocks [" << begin << ", " << end << ") outside the model's " << model_->config().num_layers);
  ahead_ = static_cast<int>(slots_for(ahead, end - begin)) - 1;
  for (std::int64_t b = begin; b < end; ++b) {
    std::vector<torch::Tensor> sources;
    // detach: a handle on today's storage, kept when the parameter is rebound to a slot.
    for (const auto& p : model_->block_parameters(b)) sources.push_back(p.detach());
    WD_CHECK(sources.size() == dtypes.size(), "stream: block " << b << " has " << sources.size()
                                                               << " tensors, " << dtypes.size() << " dtypes given");
    if (!sources_.empty()) {
      for (std::size_t k = 0; k < sources.size(); ++k) {
        WD_CHECK(sources[k].sizes() == sources_.front()[k].sizes(),
                 "stream: block " << b << " tensor " << k << " differs in shape from block " << begin);
      }
    }
    sources_.push_back(std::move(sources));
  }
  // One layout for every slot: each tensor on its own aligned offset.
  std::vector<std::uint64_t> offsets;
  for (std::size_t k = 0; k < dtypes.size(); ++k) {
    offsets.push_back(block_bytes_);
    const auto bytes = static_cast<std::uint64_t>(sources_.front()[k].numel()) * c10::elementSize(dtypes[k]);
    block_bytes_ += (bytes + kAlign - 1) / kAlign * kAlign;
  }
  slots_.resize(static_cast<std::size_t>(ahead_) + 1);
  for (auto& slot : slots_) {
    slot.storage = torch::empty({static_cast<std::int64_t>(block_bytes_)},
                                torch::TensorOptions().dtype(torch::kUInt8).device(device));
    auto* base = slot.storage.data_ptr<std::uint8_t>();
    for (std::size_t k = 0; k < dtypes.size(); ++k) {
      const auto owner = slot.storage;
      slot.views.push_back(torch::from_blob(base + offsets[k], sources_.front()[k].sizes(),
                                            [owner](void*) {},
                                            torch::TensorOptions().dtype(dtypes[k]).device(device)));
    }
  }
}

BlockStreamer::~BlockStreamer() {
  // The engine's destructor joins its worker and synchronises its copy stream; only then may
  // the slots' device buffers return to the allocator (member order alone would free them first).
  engine_.reset();
}

std::size_t BlockStreamer::slots_for(int ahead, std::int64_t blocks) {
  return static_cast<std::size_t>(std::min<std::int64_t>(ahead, blocks - 1)) + 1;
}

std::uint64_t BlockStreamer::buffer_bytes() const { return block_bytes_ * slots_.size(); }

void BlockStreamer::note(StreamEvent::Kind kind, std::int64_t block, std::size_t slot) {
  if (recording_) events_.push_back({kind, block, slot});
}

void BlockStreamer::issue(std::int64_t block) {
  std::size_t free = slots_.size();
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    if (!slots_[s].busy) {
      free = s;
      break;
    }
  }
  WD_CHECK(free < slots_.size(), "stream: no free buffer for block " << block);
  auto& slot = slots_[free];
  slot.busy = true;
  slot.block = block;
  CopyEngine::Copies copies;
  const auto& sources = sources_[static_cast<std::size_t>(block - begin_)];
  for (std::size_t k = 0; k < sources.size(); ++k) copies.emplace_back(slot.views[k], sources[k]);
  engine_->start(free, std::move(copies));
  queued_.emplace_back(block, free);
  last_issued_ = block;
  copied_bytes_ += block_bytes_;
  note(StreamEvent::kCopyStarted, block, free);
}

void BlockStreamer::before(std::int64_t block) {
  WD_CHECK(computing_ < 0, "stream: before(" << block << ") while block " << computing_ << " is computing");
  if (queued_.empty()) issue(block);
  WD_CHECK(queued_.front().first == block,
           "stream: block " << block << " was asked for, but block " << queued_.front().first
                            << " was streamed next; blocks run in order " << begin_ << ".." << end_ - 1);
  const auto slot = queued_.front().second;
  queued_.erase(queued_.begin());
  const auto t0 = Clock::now();
  engine_->wait(slot);
  wait_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
  {
    torch::NoGradGuard no_grad;
    auto params = model_->block_parameters(block);
    for (std::size_t k = 0; k < params.size(); ++k) params[k].set_data(slots_[slot].views[k]);
  }
  computing_ = block;
  computing_slot_ = slot;
  // The next blocks' copies go out before this block computes, so they overlap it.
  while (static_cast<int>(queued_.size()) < ahead_) issue(next_of(last_issued_));
  note(StreamEvent::kComputeStarted, block, slot);
}

void BlockStreamer::after(std::int64_t block) {
  WD_CHECK(computing_ == block, "stream: after(" << block << ") but the computing block is " << computing_);
  const auto slot = computing_slot_;
  engine_->release(slot);
  slots_[slot].busy = false;
  computing_ = -1;
  note(StreamEvent::kComputeDone, block, slot);
}

}  // namespace wd::teacher
