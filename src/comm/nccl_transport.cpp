// The NCCL transport: CUDA tensors from a replica's sending teacher to its students over one
// NCCL communicator per link. Compiled only with a CUDA LibTorch (c10/cuda) and NCCL.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "comm/nccl_comm.hpp"
#include "comm/mpi_check.hpp"
#include "comm/ring.hpp"
#include "comm/ring_receiver.hpp"
#include "comm/ring_sender.hpp"
#include "comm/startup.hpp"
#include "comm/transport_factory.hpp"
#include "core/host_sync.hpp"
#include "core/logging.hpp"

namespace wd::comm {

namespace {

/// The spec's hash as the signed integer broadcast_ints carries. NCCL has no header to catch a
/// size mismatch (it would hang or corrupt instead), so the ends compare it before NCCL starts.
std::int64_t spec_hash(const MessageSpec& spec) { return static_cast<std::int64_t>(spec.hash() >> 1); }

/// Typed views of one message inside a flat uint8 device buffer. The views share the buffer's
/// storage, so they keep it alive; 64-byte aligned offsets make the dtype reinterpretation valid.
std::vector<torch::Tensor> make_views(const MessageSpec& spec, const torch::Tensor& buffer,
                                      std::int64_t base) {
  const auto offsets = spec.offsets();
  std::vector<torch::Tensor> views;
  for (std::size_t i = 0; i < spec.tensors.size(); ++i) {
    const auto& t = spec.tensors[i];
    views.push_back(buffer.narrow(0, base + static_cast<std::int64_t>(offsets[i]),
                                  static_cast<std::int64_t>(t.bytes()))
                        .view(t.dtype)
                        .view(t.shape));
  }
  return views;
}

/// What both ends of a stream share: the device, the geometry, the deadline.
struct NcclWire {
  NcclWire(const MessageSpec& spec, const CommConfig& config, const c10::Device& device)
      : spec(spec),
        payload(spec.bytes()),
        index(device.has_index() ? device.index() : c10::cuda::current_device()),
        timeout(config.timeout_s),
        options(torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA, index)) {}
  /// torch's current stream on this device: the compute that produces or consumes messages.
  cudaStream_t compute_stream() const { return c10::cuda::getCurrentCUDAStream(index).stream(); }

  MessageSpec spec;
  std::uint64_t payload;
  c10::DeviceIndex index;
  std::chrono::duration<double> timeout;
  torch::TensorOptions options;
};

int link_rank_of(MPI_Comm comm) {
  int r = 0;
  WD_CHECK_MPI(MPI_Comm_rank(comm, &r));
  return r;
}

/// The sender and its receivers agree on the message spec (with deadline) before NCCL starts.
void agree_on_spec(const StreamEnd& end, const NcclWire& w, HealthChannel* health) {
  const int root = end.sending ? link_rank_of(end.comm) : end.peer_ranks.front();
  std::vector<std::int64_t> theirs{spec_hash(w.spec), static_cast<std::int64_t>(w.payload)};
  broadcast_ints(theirs, root, end.comm, w.timeout.count(), "NCCL transport message spec", health);
  std::exception_ptr problem;
  if (!end.sending && (theirs[0] != spec_hash(w.spec) ||
                       theirs[1] != static_cast<std::int64_t>(w.payload))) {
    problem = std::make_exception_ptr(Error(
        "rank " + std::to_string(end.world_rank) + " on " + end.name + ": the sender's message spec (" +
        std::to_string(theirs[1]) + " payload bytes) differs from this rank's (" +
        std::to_string(w.payload) + " payload bytes)"));
  }
  agree_on_startup("NCCL transport message spec", problem, end.comm, w.timeout.count(), health);
}

/// The sending end over NCCL. Member order matters: the communicator is declared last, so it
/// is destroyed (or aborted) before the stream and the ring buffers, and an abort stops the
/// kernels before their memory goes back to the caching allocator.
class NcclSender final : public RingSender {
 public:
  NcclSender(const StreamEnd& end, const MessageSpec& spec, const CommConfig& config,
             std::size_t slots, std::int64_t first, std::int64_t end_step, const c10::Device& device,
             HealthChannel* health)
      : RingSender(end, spec, slots, first, end_step, health), w_(spec, config, device), stream_(w_.index) {
    agree_on_spec(end, w_, health);
    const std::size_t messages = messages_per_slot();
    for (std::size_t i = 0; i < slots; ++i) {
      Slot slot{torch::empty({static_cast<std::int64_t>(messages * w_.payload)}, w_.options), {},
                CudaEvent(w_.index), CudaEvent(w_.index)};
      for (std::size_t m = 0; m < messages; ++m)
        slot.views.push_back(make_views(spec, slot.buffer, static_cast<std::int64_t>(m * w_.payload)));
      ring_.push_back(std::move(slot));
    }
    comm_.emplace(end.comm, w_.index, config.timeout_s, health);
    WD_CHECK(comm_->size() == static_cast<int>(end.peers.size()) + 1,
             end.name << " of rank " << end.world_rank << " has " << comm_->size()
                      << " ranks, expected 1 sender + " << end.peers.size() << " receivers");
  }

 private:
  struct Slot {
    torch::Tensor buffer;                           ///< [message][payload] bytes on the device
    std::vector<std::vector<torch::Tensor>> views;  ///< [message][tensor]
    CudaEvent packed;                               ///< on the compute stream, after the copies
    CudaEvent sent;                                 ///< on the comm stream, after the sends
  };

  /// Copies (and converts) a message into the slot on torch's current stream, like the MPI
  /// transport's pack; host tensors are uploaded by the same copy.
  void pack(std::size_t slot, std::size_t message, const TensorDict& dict) override {
    const c10::cuda::CUDAGuard guard(w_.index);
    for (std::size_t i = 0; i < w_.spec.tensors.size(); ++i) {
      ring_[slot].views[message][i].copy_(dict.at(w_.spec.tensors[i].name), /*non_blocking=*/true);
    }
  }

  /// Orders the sends after the copies (an event, not a host sync) and issues them on the comm
  /// stream.
  void start(std::size_t slot, std::int64_t) override {
    Slot& s = ring_[slot];
    s.packed.record(w_.compute_stream());
    s.packed.block(stream_.get());
    if (ends().broadcast) {
      void* data = s.buffer.data_ptr();
      comm_->broadcast(data, data, w_.payload, comm_->rank(), stream_.get());
    } else {
      auto group = comm_->group();  // one fused launch: the receivers' sends proceed in parallel
      for (std::size_t i = 0; i < ends().peers.size(); ++i) {
        comm_->send(s.buffer.data_ptr<std::uint8_t>() + i * w_.payload, w_.payload,
                    ends().peer_ranks[i], stream_.get());
      }
      group.end();
    }
    s.sent.record(stream_.get());
  }

  void wait_sent(std::size_t slot, std::int64_t step) override {
    note_host_sync("NcclSender::wait_sent");
    comm_->wait(ring_[slot].sent.get(),
                WaitInfo{"send batch", step, w_.payload * ends().peers.size(), ends().peers}, w_.timeout);
  }

  NcclWire w_;
  CudaStream stream_;
  std::vector<Slot> ring_;
  std::optional<NcclComm> comm_;  ///< last: destroyed (or aborted) first
};

/// A receiving end over NCCL: a ring of device buffers, receives on a dedicated stream.
class NcclReceiver final : public RingReceiver {
 public:
  NcclReceiver(const StreamEnd& end, const MessageSpec& spec, const CommConfig& config,
               std::size_t slots, std::int64_t first, std::int64_t end_step, const c10::Device& device,
               HealthChannel* health)
      : RingReceiver(end, slots, first, end_step, health), w_(spec, config, device), stream_(w_.index) {
    agree_on_spec(end, w_, health);
    for (std::size_t i = 0; i < slots; ++i) {
      Slot slot{torch::empty({static_cast<std::int64_t>(w_.payload)}, w_.options), {},
                CudaEvent(w_.index), CudaEvent(w_.index)};
      const auto views = make_views(spec, slot.buffer, 0);
      for (std::size_t v = 0; v < views.size(); ++v) slot.message.tensors[spec.tensors[v].name] = views[v];
      ring_.push_back(std::move(slot));
    }
    comm_.emplace(end.comm, w_.index, config.timeout_s, health);
    post_ahead();
  }

 private:
  struct Slot {
    torch::Tensor buffer;
    Message message;
    CudaEvent received;  ///< on the comm stream, after the receive
    CudaEvent consumed;  ///< on the compute stream, at release
    bool reused = false;
  };

  /// Posts happen in step order (RingReceiver), and NCCL matches a pair's operations in
  /// issue order, so step s lands in the slot posted for s.
  void post(std::size_t slot, std::int64_t) override {
    Slot& s = ring_[slot];
    if (s.reused) s.consumed.block(stream_.get());
    void* data = s.buffer.data_ptr();
    if (ends().broadcast) {
      comm_->broadcast(data, data, w_.payload, sender_rank(), stream_.get());
    } else {
      comm_->recv(data, w_.payload, sender_rank(), stream_.get());
    }
    s.received.record(stream_.get());
  }

  void wait_received(std::size_t slot, std::int64_t step) override {
    note_host_sync("NcclReceiver::wait_received");
    comm_->wait(ring_[slot].received.get(), WaitInfo{"recv batch", step, w_.payload, {sender()}}, w_.timeout);
  }

  Message& accept(std::size_t slot, std::int64_t) override {
    // Already complete on the host; the device-side wait keeps the order explicit for torch's
    // stream should the host wait ever be dropped.
    ring_[slot].received.block(w_.compute_stream());
    return ring_[slot].message;
  }

  /// The compute queued so far may still read the views: the next receive into this slot
  /// waits for it on the device.
  void consumed(std::size_t slot) override {
    ring_[slot].consumed.record(w_.compute_stream());
    ring_[slot].reused = true;
  }

  NcclWire w_;
  CudaStream stream_;
  std::vector<Slot> ring_;
  std::optional<NcclComm> comm_;  ///< last: destroyed (or aborted) first
};

}  // namespace

bool nccl_built() { return true; }

namespace {

/// What both NCCL factories check before any collective.
std::size_t nccl_ring_slots(const StreamEnd& end, const CommConfig& config, std::int64_t first_step,
                            std::int64_t end_step, const c10::Device& device, bool sending) {
  ConfigProblems problems;
  config.validate(problems);
  problems.throw_if_any("comm config");
  WD_CHECK_AS(ConfigError, device.is_cuda(),
              "the NCCL transport streams CUDA tensors; rank " << end.world_rank << " asked for "
                                                               << device.str() << " on " << end.name);
  check_end(end, sending);
  return ring_slots(config.prefetch_depth, first_step, end_step);
}

}  // namespace

std::unique_ptr<Sender> make_nccl_sender(const StreamEnd& end, const MessageSpec& spec,
                                         const CommConfig& config, std::int64_t first_step,
                                         std::int64_t end_step, const c10::Device& device,
                                         HealthChannel* health) {
  const std::size_t slots = nccl_ring_slots(end, config, first_step, end_step, device, /*sending=*/true);
  return std::make_unique<NcclSender>(end, spec, config, slots, first_step, end_step, device, health);
}

std::unique_ptr<Receiver> make_nccl_receiver(const StreamEnd& end, const MessageSpec& spec,
                                             const CommConfig& config, std::int64_t first_step,
                                             std::int64_t end_step, const c10::Device& device,
                                             HealthChannel* health) {
  const std::size_t slots = nccl_ring_slots(end, config, first_step, end_step, device, /*sending=*/false);
  return std::make_unique<NcclReceiver>(end, spec, config, slots, first_step, end_step, device, health);
}

}  // namespace wd::comm
