// The MPI wire: host-tensor streams over MPI point-to-point, each message a 64-byte header and
// its payload, sent from and received into preallocated (optionally pinned) ring buffers.
#include "comm/mpi_transport.hpp"

#include <cstring>
#include <limits>
#include <sstream>

#include "comm/comm_config.hpp"
#include "comm/mpi_runtime.hpp"
#include "comm/ring.hpp"
#include "comm/ring_receiver.hpp"
#include "comm/ring_sender.hpp"
#include "core/errors.hpp"

namespace wd::comm {

namespace {

constexpr std::uint64_t kWireAlign = 64;
constexpr std::uint64_t kMagic = 0x5744'4953'5449'4c31ULL;  // "WDISTIL1"
// One tag for the whole stream: MPI's non-overtaking rule keeps the steps of one sender in order.
constexpr int kTag = 7701;

/// Precedes every payload on the wire. 64 bytes, so the payload after it stays aligned.
struct WireHeader {
  std::uint64_t magic;
  std::int64_t step;
  std::uint64_t payload_bytes;
  std::uint64_t spec_hash;  ///< names, dtypes and shapes: catches teacher/student spec drift
  std::uint64_t reserved[4];
};
static_assert(sizeof(WireHeader) == kWireAlign, "the header keeps the payload 64-byte aligned");

int checked_count(std::uint64_t bytes, const char* what) {
  WD_CHECK(
      bytes <= static_cast<std::uint64_t>(std::numeric_limits<int>::max()),
      what << " of " << bytes << " bytes exceeds MPI's int count; use a smaller batch per student");
  return static_cast<int>(bytes);
}

/// Typed views of one message's tensors inside a byte buffer starting at `base`.
std::vector<torch::Tensor> make_views(const MessageSpec& spec,
                                      const std::vector<std::uint64_t>& offsets, std::uint8_t* base,
                                      const torch::Tensor& owner) {
  std::vector<torch::Tensor> views;
  views.reserve(spec.tensors.size());
  for (std::size_t i = 0; i < spec.tensors.size(); ++i) {
    const auto& t = spec.tensors[i];
    // The deleter holds the owning buffer, so a view never outlives the memory it points into.
    views.push_back(torch::from_blob(
        base + offsets[i], t.shape, [owner](void*) {}, torch::TensorOptions().dtype(t.dtype)));
  }
  return views;
}

/// Ring buffers in host memory; page-locked (`pinned`) when a CUDA device copies in or out of
/// them, so those copies are DMA transfers that can overlap compute.
torch::TensorOptions host_buffer_options(bool pinned) {
  return torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(pinned);
}

void write_header(std::uint8_t* at, std::int64_t step, std::uint64_t payload, std::uint64_t hash) {
  WireHeader h{};
  h.magic = kMagic;
  h.step = step;
  h.payload_bytes = payload;
  h.spec_hash = hash;
  std::memcpy(at, &h, sizeof h);
}

/// The geometry both MPI ends share: payload offsets, message size, spec hash, deadline.
struct Wire {
  Wire(const MessageSpec& spec, const CommConfig& config)
      : offsets(spec.offsets()),
        payload(spec.bytes()),
        message_bytes(sizeof(WireHeader) + payload),
        hash(spec.hash()),
        timeout(config.timeout_s) {
    checked_count(message_bytes, "a batch message");
  }
  std::vector<std::uint64_t> offsets;
  std::uint64_t payload;
  std::uint64_t message_bytes;
  std::uint64_t hash;
  std::chrono::duration<double> timeout;
};

/// The sending end over MPI. Each ring slot holds one step: in scatter mode one message per
/// receiver, in broadcast mode a single message sent to all of them.
class MpiSender final : public RingSender {
 public:
  MpiSender(const StreamEnd& end, const MessageSpec& spec, const CommConfig& config,
            std::size_t slots, std::int64_t first, std::int64_t end_step, HealthChannel* health,
            bool pinned)
      : RingSender(end, spec, slots, first, end_step, health), wire_(spec, config), ring_(slots) {
    const std::size_t messages = messages_per_slot();
    for (auto& slot : ring_) {
      slot.buffer = torch::empty({static_cast<std::int64_t>(messages * wire_.message_bytes)},
                                 host_buffer_options(pinned));
      auto* bytes = slot.buffer.data_ptr<std::uint8_t>();
      for (std::size_t m = 0; m < messages; ++m) {
        slot.views.push_back(make_views(spec, wire_.offsets,
                                        bytes + m * wire_.message_bytes + sizeof(WireHeader),
                                        slot.buffer));
      }
      slot.requests.assign(end.peers.size(), MPI_REQUEST_NULL);
    }
  }

  ~MpiSender() override {
    std::vector<MPI_Request*> pending;
    for (auto& slot : ring_) {
      for (auto& r : slot.requests) pending.push_back(&r);
    }
    if (!cancel_and_settle(pending)) {
      for (auto& slot : ring_) keep_until_exit(slot.buffer);
    }
  }

 private:
  struct Slot {
    torch::Tensor buffer;
    std::vector<std::vector<torch::Tensor>> views;  ///< [message][tensor]
    std::vector<MPI_Request> requests;              ///< one per receiver
  };

  void pack(std::size_t slot, std::size_t message, const TensorDict& dict) override {
    Slot& s = ring_[slot];
    for (std::size_t i = 0; i < spec().tensors.size(); ++i) {
      // copy_ converts to the spec dtype and brings device tensors to the host.
      s.views[message][i].copy_(dict.at(spec().tensors[i].name));
    }
  }

  void start(std::size_t slot, std::int64_t step) override {
    Slot& s = ring_[slot];
    auto* bytes = s.buffer.data_ptr<std::uint8_t>();
    for (std::size_t m = 0; m < messages_per_slot(); ++m)
      write_header(bytes + m * wire_.message_bytes, step, wire_.payload, wire_.hash);
    const bool shared = messages_per_slot() == 1;
    const int count = static_cast<int>(wire_.message_bytes);
    for (std::size_t i = 0; i < ends().peers.size(); ++i) {
      std::uint8_t* message = bytes + (shared ? 0 : i * wire_.message_bytes);
      WD_CHECK_MPI(MPI_Isend(message, count, MPI_BYTE, ends().peer_ranks[i], kTag, ends().comm,
                             &s.requests[i]));
    }
  }

  void wait_sent(std::size_t slot, std::int64_t step) override {
    Slot& s = ring_[slot];
    WaitInfo info{"send batch", step, wire_.message_bytes * ends().peers.size(), ends().peers,
                  /*peer_per_request=*/true};
    wait_all_with_deadline(s.requests, info, wire_.timeout, ends().world_rank, health());
  }

  /// Testing the in-flight sends drives MPI's progress engine for large (rendezvous) messages
  /// while the sender is otherwise busy computing.
  void progress() override {
    for (auto& s : ring_) {
      int done = 0;
      WD_CHECK_MPI(MPI_Testall(static_cast<int>(s.requests.size()), s.requests.data(), &done,
                               MPI_STATUSES_IGNORE));
    }
  }

  Wire wire_;
  std::vector<Slot> ring_;
};

/// A receiving end over MPI: receives into a ring of preallocated buffers. Receives are posted
/// in step order (RingReceiver), so MPI's non-overtaking rule delivers step s into the
/// slot posted for s; the header proves it.
class MpiReceiver final : public RingReceiver {
 public:
  MpiReceiver(const StreamEnd& end, const MessageSpec& spec, const CommConfig& config,
              std::size_t slots, std::int64_t first, std::int64_t end_step, HealthChannel* health,
              bool pinned)
      : RingReceiver(end, slots, first, end_step, health), spec_(spec), wire_(spec, config), ring_(slots) {
    for (auto& slot : ring_) {
      slot.buffer = torch::empty({static_cast<std::int64_t>(wire_.message_bytes)},
                                 host_buffer_options(pinned));
      const auto views = make_views(spec, wire_.offsets,
                                    slot.buffer.data_ptr<std::uint8_t>() + sizeof(WireHeader), slot.buffer);
      for (std::size_t i = 0; i < views.size(); ++i)
        slot.message.tensors[spec.tensors[i].name] = views[i];
    }
    try {
      post_ahead();
    } catch (...) {
      retire();
      throw;
    }
  }

  ~MpiReceiver() override { retire(); }

 private:
  struct Slot {
    torch::Tensor buffer;  ///< header + payload; the message's tensors view it
    Message message;
    MPI_Request request = MPI_REQUEST_NULL;
  };

  void post(std::size_t slot, std::int64_t) override {
    Slot& s = ring_[slot];
    WD_CHECK_MPI(MPI_Irecv(s.buffer.data_ptr(), static_cast<int>(wire_.message_bytes), MPI_BYTE,
                           sender_rank(), kTag, ends().comm, &s.request));
  }

  void wait_received(std::size_t slot, std::int64_t step) override {
    WaitInfo info{"recv batch", step, wire_.message_bytes, {sender()}};
    try {
      wait_with_deadline(ring_[slot].request, info, wire_.timeout, ends().world_rank, health());
    } catch (const TimeoutError&) {
      throw;  // already names the operation, the step and the ranks
    } catch (const MpiError& e) {
      throw MpiError("recv batch of step " + std::to_string(step) + " from rank " +
                     std::to_string(sender()) + ": " + e.what());
    }
  }

  Message& accept(std::size_t slot, std::int64_t step) override {
    Slot& s = ring_[slot];
    WireHeader h{};
    std::memcpy(&h, s.buffer.data_ptr(), sizeof h);
    const std::string from = "batch for step " + std::to_string(step) + " from rank " +
                             std::to_string(sender()) + " on rank " + std::to_string(ends().world_rank);
    if (h.magic != kMagic) {
      std::ostringstream os;
      os << from << ": bad header magic 0x" << std::hex << h.magic << " (expected 0x" << kMagic
         << "); the stream is out of sync";
      throw Error(os.str());
    }
    WD_CHECK(h.payload_bytes == wire_.payload && h.spec_hash == wire_.hash,
             from << ": the sender's message spec (" << h.payload_bytes
                  << " payload bytes) differs from this rank's (" << wire_.payload
                  << " payload bytes, tensors " << tensor_names(spec_) << ")");
    WD_CHECK(h.step == step, from << ": received step " << h.step << " where step " << step
                                  << " was expected; the stream is out of order");
    return s.message;
  }

  /// Cancels the receives still posted (a run that ends early or fails).
  void retire() noexcept {
    std::vector<MPI_Request*> pending;
    for (auto& slot : ring_) pending.push_back(&slot.request);
    if (!cancel_and_settle(pending)) {
      for (auto& slot : ring_) keep_until_exit(slot.buffer);
    }
  }

  MessageSpec spec_;
  Wire wire_;
  std::vector<Slot> ring_;
};

}  // namespace

std::unique_ptr<Sender> make_mpi_sender(const StreamEnd& end, const MessageSpec& spec,
                                        const CommConfig& config, std::int64_t first_step,
                                        std::int64_t end_step, HealthChannel* health, bool pinned) {
  ConfigProblems problems;
  config.validate(problems);
  problems.throw_if_any("comm config");
  check_end(end, /*sending=*/true);
  return std::make_unique<MpiSender>(end, spec, config, ring_slots(config.prefetch_depth, first_step, end_step),
                                     first_step, end_step, health, pinned);
}

std::unique_ptr<Receiver> make_mpi_receiver(const StreamEnd& end, const MessageSpec& spec,
                                            const CommConfig& config, std::int64_t first_step,
                                            std::int64_t end_step, HealthChannel* health, bool pinned) {
  ConfigProblems problems;
  config.validate(problems);
  problems.throw_if_any("comm config");
  check_end(end, /*sending=*/false);
  return std::make_unique<MpiReceiver>(end, spec, config, ring_slots(config.prefetch_depth, first_step, end_step),
                                       first_step, end_step, health, pinned);
}

}  // namespace wd::comm
