// The block streamer, its host copy engine (the CPU build's stand-in for the device) and the
// worker thread both copy engines run on.
#include "teacher/block_streamer.hpp"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "core/errors.hpp"
#include "teacher/copy_worker.hpp"

namespace wd::teacher {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kAlign = 256;  // slot views start on cache-line and DMA-friendly offsets
/// parallel_copy's pieces: large enough that a thread's start and a copy_ call cost nothing
/// next to the bytes, small enough that a block of a few hundred MB spreads over the threads.
constexpr std::uint64_t kPieceBytes = 8ull << 20;

/// The host as the device: the worker thread copies while the caller computes.
class HostCopyEngine final : public CopyEngine {
 public:
  HostCopyEngine(std::size_t slots, double timeout_s, int threads)
      : worker_(slots, timeout_s, "the copy of a block", [this, threads](std::size_t, Copies& copies) {
          const auto start = Clock::now();
          parallel_copy(copies, threads);
          copy_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
        }) {}

  /// The host's copy is both the staging and the upload.
  CopyStats stats() const override {
    const double s = 1e-9 * static_cast<double>(copy_ns_.load());
    return {s, 0, 0};
  }

  void start(std::size_t slot, Copies copies) override { worker_.start(slot, std::move(copies)); }
  void wait(std::size_t slot) override { worker_.wait(slot); }
  void release(std::size_t) override {}  // host compute is synchronous: done when issued

 private:
  std::atomic<std::int64_t> copy_ns_{0};  ///< written by the worker
  CopyWorker worker_;  ///< last: its thread uses everything above
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

std::unique_ptr<CopyEngine> make_host_copy_engine(std::size_t slots, double timeout_s, int threads) {
  return std::make_unique<HostCopyEngine>(slots, timeout_s, threads);
}

void parallel_copy(const CopyEngine::Copies& copies, int threads) {
  torch::NoGradGuard no_grad;  // grad mode is per thread; the copies never need autograd
  if (threads <= 1) {
    for (const auto& [dst, src] : copies) dst.copy_(src);
    return;
  }
  CopyEngine::Copies pieces;
  for (const auto& [dst, src] : copies) {
    if (!dst.is_contiguous() || !src.is_contiguous() || dst.numel() == 0) {
      pieces.emplace_back(dst, src);  // whole: a flat view needs contiguous tensors
      continue;
    }
    const auto d = dst.view({-1}), s = src.view({-1});
    const auto step = std::max<std::int64_t>(1, static_cast<std::int64_t>(kPieceBytes / dst.element_size()));
    for (std::int64_t at = 0; at < d.numel(); at += step) {
      const auto len = std::min(step, d.numel() - at);
      pieces.emplace_back(d.narrow(0, at, len), s.narrow(0, at, len));
    }
  }
  std::atomic<std::size_t> next{0};
  std::mutex failed;
  std::exception_ptr failure;
  const auto work = [&] {
    torch::NoGradGuard thread_no_grad;
    try {
      for (auto i = next++; i < pieces.size(); i = next++) pieces[i].first.copy_(pieces[i].second);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failed);
      if (!failure) failure = std::current_exception();
    }
  };
  const auto helpers = std::min<std::size_t>(static_cast<std::size_t>(threads) - 1, pieces.size());
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < helpers; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

std::vector<std::uint64_t> BlockStreamer::block_layout(const std::vector<torch::Tensor>& tensors,
                                                       const std::vector<c10::ScalarType>& dtypes,
                                                       std::uint64_t& block_bytes) {
  WD_CHECK(tensors.size() == dtypes.size(), "stream: " << tensors.size() << " tensors, " << dtypes.size() << " dtypes");
  std::vector<std::uint64_t> offsets;
  block_bytes = 0;
  for (std::size_t k = 0; k < dtypes.size(); ++k) {
    offsets.push_back(block_bytes);
    const auto bytes = static_cast<std::uint64_t>(tensors[k].numel()) * c10::elementSize(dtypes[k]);
    block_bytes += (bytes + kAlign - 1) / kAlign * kAlign;
  }
  return offsets;
}

void BlockStreamer::write_arena(WanDiT model, std::int64_t begin, std::int64_t end,
                                const std::vector<c10::ScalarType>& dtypes, std::uint8_t* arena, int threads) {
  std::uint64_t block_bytes = 0;
  const auto offsets = block_layout(model->block_parameters(begin), dtypes, block_bytes);
  CopyEngine::Copies copies;
  for (std::int64_t b = begin; b < end; ++b) {
    auto* base = arena + static_cast<std::uint64_t>(b - begin) * block_bytes;
    const auto params = model->block_parameters(b);
    WD_CHECK(params.size() == dtypes.size(), "stream: block " << b << " has " << params.size() << " tensors");
    for (std::size_t k = 0; k < params.size(); ++k) {
      copies.emplace_back(torch::from_blob(base + offsets[k], params[k].sizes(), torch::TensorOptions().dtype(dtypes[k])),
                          params[k].detach());
    }
  }
  parallel_copy(copies, threads);
}

BlockStreamer::BlockStreamer(WanDiT model, std::int64_t begin, std::int64_t end, int ahead,
                             const c10::Device& device, const std::vector<c10::ScalarType>& dtypes,
                             std::unique_ptr<CopyEngine> engine, std::uint8_t* arena)
    : model_(std::move(model)), begin_(begin), end_(end), engine_(std::move(engine)), from_arena_(arena != nullptr) {
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
  // One layout for every slot (and the arena): each tensor on its own aligned offset.
  const auto offsets = block_layout(sources_.front(), dtypes, block_bytes_);
  std::vector<c10::IntArrayRef> shapes;
  const auto first = sources_.front();  // the tensors' shapes, kept past the arena's ranges below
  for (const auto& t : first) shapes.push_back(t.sizes());
  if (from_arena_) {
    // Each block is its one range of the arena: one copy (one DMA) per block.
    for (std::size_t i = 0; i < sources_.size(); ++i) {
      sources_[i] = {torch::from_blob(arena + i * block_bytes_, {static_cast<std::int64_t>(block_bytes_)},
                                      torch::TensorOptions().dtype(torch::kUInt8))};
    }
  }
  slots_.resize(static_cast<std::size_t>(ahead_) + 1);
  for (auto& slot : slots_) {
    slot.storage = torch::empty({static_cast<std::int64_t>(block_bytes_)},
                                torch::TensorOptions().dtype(torch::kUInt8).device(device));
    auto* base = slot.storage.data_ptr<std::uint8_t>();
    for (std::size_t k = 0; k < dtypes.size(); ++k) {
      const auto owner = slot.storage;
      slot.views.push_back(torch::from_blob(base + offsets[k], shapes[k],
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
  if (from_arena_) {
    copies.emplace_back(slot.storage, sources.front());
  } else {
    for (std::size_t k = 0; k < sources.size(); ++k) copies.emplace_back(slot.views[k], sources[k]);
  }
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
