// BlockStreamer: `teacher.placement = stream`. The weights stay in host memory (the node's pinned
// arena, or mapped from the checkpoint); each block is copied into one of a few reused device
// buffers ahead of its use, so the copy of block i+1 overlaps the compute of block i.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "model/wan_dit.hpp"

namespace wd::teacher {

/// What a copy engine spent so far (the benchmark's per-block figures; zeros where an engine
/// does not measure).
struct CopyStats {
  double staging_s = 0;           ///< host seconds staging blocks into pinned memory (copy threads)
  double upload_s = 0;            ///< device seconds of the host-to-device copies that were timed
  std::int64_t uploads_timed = 0; ///< copies whose device time is in upload_s
};

/// Moves one block's tensors into a buffer slot, asynchronously. Slots are reused in turn:
/// `start` into a slot is called only after `release` of the compute that read it.
class CopyEngine {
 public:
  using Copies = std::vector<std::pair<torch::Tensor, torch::Tensor>>;  ///< (destination, source)
  virtual ~CopyEngine() = default;
  /// Starts copying every source into its destination (shapes equal; dtypes may differ).
  virtual void start(std::size_t slot, Copies copies) = 0;
  /// Returns once compute issued after it sees the slot's copy complete.
  virtual void wait(std::size_t slot) = 0;
  /// The compute that reads `slot` has been issued; the next copy into it must come after it.
  virtual void release(std::size_t slot) = 0;
  /// Figures so far; safe to call between forwards.
  virtual CopyStats stats() const { return {}; }
};

/// Host "device" (the CPU build): a worker thread copies while the caller computes, each block
/// in pieces over `threads` threads. A wait longer than `timeout_s` throws.
std::unique_ptr<CopyEngine> make_host_copy_engine(std::size_t slots, double timeout_s, int threads = 1);
/// CUDA device, from pageable memory (the mapped checkpoint): a worker thread stages host data
/// into pinned buffers (converting the dtype) on `threads` threads, copies them on a side
/// stream, ordered against the compute stream with events. Throws wd::Error in builds without
/// the CUDA toolkit.
std::unique_ptr<CopyEngine> make_cuda_copy_engine(std::size_t slots, const c10::Device& device,
                                                  double timeout_s, int threads = 1);
/// CUDA device, from pinned (registered) memory of the destination's dtype: `start` queues one
/// cudaMemcpyAsync per pair on a side stream after the slot's last reader; `wait` makes the
/// compute stream wait for it on the device. No thread, no host copy, no host wait.
std::unique_ptr<CopyEngine> make_cuda_direct_copy_engine(std::size_t slots, const c10::Device& device);

/// Copies every source into its destination, each pair in pieces of a few MiB dealt over
/// `threads` threads (the calling one among them); rethrows the first failure.
void parallel_copy(const CopyEngine::Copies& copies, int threads);

/// What the streamer did, in order (for tests and the benchmark).
struct StreamEvent {
  enum Kind { kCopyStarted, kComputeStarted, kComputeDone } kind;
  std::int64_t block;
  std::size_t slot;
};

class BlockStreamer {
 public:
  /// Streams blocks [begin, end) of `model`, whose block parameters are now bound to the host
  /// tensors to stream from (e.g. views of the mapped checkpoint). Allocates `ahead + 1` slots
  /// on `device`, each holding one block in `dtypes` (per block_parameters entry, in order).
  /// With `arena` (write_arena's bytes of these blocks), each block is copied from there as
  /// one range of block_bytes() instead, tensor by tensor from the bound parameters otherwise.
  BlockStreamer(WanDiT model, std::int64_t begin, std::int64_t end, int ahead,
                const c10::Device& device, const std::vector<c10::ScalarType>& dtypes,
                std::unique_ptr<CopyEngine> engine, std::uint8_t* arena = nullptr);
  /// Drains the copy engine before the device slots go: uploads are always in flight at the
  /// end (before() prefetches the next forward's first blocks).
  ~BlockStreamer();
  BlockStreamer(const BlockStreamer&) = delete;
  /// The buffers a streamer of `blocks` blocks holds for `ahead`: ahead + 1, but never more
  /// than the blocks (copying ahead more blocks than there are others would copy the
  /// computing block a second time). The copy engine needs as many slots.
  static std::size_t slots_for(int ahead, std::int64_t blocks);
  BlockStreamer& operator=(const BlockStreamer&) = delete;
  /// One block's layout in a slot and in an arena: each of `tensors` in its dtype of `dtypes`
  /// at a 256-byte aligned offset (returned, in order); `block_bytes` gets the block's size.
  static std::vector<std::uint64_t> block_layout(const std::vector<torch::Tensor>& tensors,
                                                 const std::vector<c10::ScalarType>& dtypes,
                                                 std::uint64_t& block_bytes);
  /// Writes blocks [begin, end) of `model` (its block parameters as bound now) to `arena`, one
  /// block_layout after another, converted to `dtypes`, copying on `threads` threads.
  static void write_arena(WanDiT model, std::int64_t begin, std::int64_t end,
                          const std::vector<c10::ScalarType>& dtypes, std::uint8_t* arena, int threads);

  /// Before run_block(i): waits for block i's copy, binds the model's block i to its slot,
  /// and starts the copies of the next `ahead` blocks (cyclically: the next forward starts
  /// again at `begin`).
  void before(std::int64_t block);
  /// After run_block(i) was issued: its slot may be refilled once that compute is done.
  void after(std::int64_t block);

  /// Bytes of the device slots, of one block, and copied so far.
  std::uint64_t buffer_bytes() const;
  std::uint64_t block_bytes() const { return block_bytes_; }
  std::uint64_t copied_bytes() const { return copied_bytes_; }
  /// Seconds `before` spent waiting for copies (compute stalled on the copy).
  double wait_seconds() const { return wait_seconds_; }
  /// The copy engine's figures (staging and upload times).
  CopyStats copy_stats() const { return engine_->stats(); }
  /// Turns on recording of StreamEvents.
  void record(bool on) { recording_ = on; }
  const std::vector<StreamEvent>& events() const { return events_; }

 private:
  struct Slot {
    torch::Tensor storage;              ///< one flat byte buffer per slot
    std::vector<torch::Tensor> views;   ///< block_parameters order
    std::int64_t block = -1;            ///< the block copied (or being copied) into it
    bool busy = false;                  ///< a queued copy or the computing block uses it
  };
  std::int64_t next_of(std::int64_t block) const { return block + 1 == end_ ? begin_ : block + 1; }
  void issue(std::int64_t block);
  void note(StreamEvent::Kind kind, std::int64_t block, std::size_t slot);

  WanDiT model_;
  std::int64_t begin_, end_;
  int ahead_;
  std::unique_ptr<CopyEngine> engine_;
  /// Per block (index - begin): the host tensors, or with an arena its one byte range.
  std::vector<std::vector<torch::Tensor>> sources_;
  bool from_arena_ = false;
  std::vector<Slot> slots_;
  std::vector<std::pair<std::int64_t, std::size_t>> queued_;  ///< copies started, in use order
  std::int64_t last_issued_ = -1;
  std::int64_t computing_ = -1;
  std::size_t computing_slot_ = 0;
  std::uint64_t block_bytes_ = 0;
  std::uint64_t copied_bytes_ = 0;
  double wait_seconds_ = 0;
  bool recording_ = false;
  std::vector<StreamEvent> events_;
};

}  // namespace wd::teacher
