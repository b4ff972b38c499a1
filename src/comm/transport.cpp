// [comm] config, message specs, the MPI batch transport and the bucketed gradient all-reduce.
#include "comm/transport.hpp"

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <thread>

#include "comm/mpi_runtime.hpp"
#include "comm/ring_transport.hpp"
#include "core/logging.hpp"

namespace wd::comm {

namespace {

constexpr std::uint64_t kAlign = 64;
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
static_assert(sizeof(WireHeader) == kAlign, "the header keeps the payload 64-byte aligned");

std::uint64_t align_up(std::uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string num(double value) {
  std::ostringstream os;
  os << value;
  return os.str();
}

std::string names_of(const TensorDict& dict) {
  std::string out;
  for (const auto& [name, tensor] : dict) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "(none)" : out;
}

std::string names_of(const MessageSpec& spec) {
  std::string out;
  for (const auto& t : spec.tensors) out += (out.empty() ? "" : ", ") + t.name;
  return out.empty() ? "(none)" : out;
}

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
class MpiSender final : public SendingTransport {
 public:
  MpiSender(const StreamEnd& end, const MessageSpec& spec, const CommConfig& config,
            std::size_t slots, std::int64_t first, std::int64_t end_step, bool pinned)
      : SendingTransport(end, spec, slots, first, end_step), wire_(spec, config), ring_(slots) {
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
    wait_all_with_deadline(s.requests, info, wire_.timeout, ends().world_rank);
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
/// in step order (ReceivingTransport), so MPI's non-overtaking rule delivers step s into the
/// slot posted for s; the header proves it.
class MpiReceiver final : public ReceivingTransport {
 public:
  MpiReceiver(const StreamEnd& end, const MessageSpec& spec, const CommConfig& config,
              std::size_t slots, std::int64_t first, std::int64_t end_step, bool pinned)
      : ReceivingTransport(end, slots, first, end_step), spec_(spec), wire_(spec, config), ring_(slots) {
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
      wait_with_deadline(ring_[slot].request, info, wire_.timeout, ends().world_rank);
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
                  << " payload bytes, tensors " << names_of(spec_) << ")");
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

void CommConfig::bind(OptionTable& table) {
  table
      .bind(
          "comm.prefetch_depth", prefetch_depth,
          "batches a teacher may run ahead of its students; each student posts this many receives "
          "ahead into as many preallocated buffers")
      .bind("comm.timeout_s", timeout_s,
            "deadline in seconds of every wait (batch send/receive, gradient all-reduce); a peer "
            "silent for longer is reported by rank")
      .bind(
          "comm.mode", mode,
          "scatter: each student receives its own slice of the teacher's batch | broadcast: every "
          "student of a replica receives the same batch")
      .bind("comm.bucket_mb", bucket_mb,
            "size in MiB of a gradient all-reduce bucket (one MPI call per bucket)")
      .bind("comm.watchdog_s", watchdog_s,
            "seconds without progress after which a rank's watchdog ends it with exit code 6 (a "
            "call stuck inside a library); 0 = 2 x comm.timeout_s + 90")
      .bind("comm.backend", backend,
            "auto | mpi | nccl: what carries teacher outputs and the students' gradient all-reduce. "
            "auto: NCCL where every rank of the link (or student group) holds CUDA tensors on a "
            "GPU of its own, MPI (pinned host staging) otherwise; nccl where it cannot work is an "
            "error naming the ranks and GPUs");
}

double CommConfig::watchdog_limit() const { return watchdog_s > 0 ? watchdog_s : 2 * timeout_s + 90; }

void CommConfig::validate(ConfigProblems& problems) const {
  problems.check(prefetch_depth >= 1,
                 "comm.prefetch_depth(" + std::to_string(prefetch_depth) + ") must be >= 1");
  problems.check(timeout_s > 0, "comm.timeout_s(" + num(timeout_s) + ") must be > 0");
  problems.check(mode == "scatter" || mode == "broadcast",
                 "comm.mode(" + mode + ") must be scatter or broadcast");
  problems.check(backend == "auto" || backend == "mpi" || backend == "nccl",
                 "comm.backend(" + backend + ") must be auto, mpi or nccl");
  // MPI counts are ints: a bucket holds at most 2^31-1 floats (8 GiB).
  problems.check(bucket_mb > 0 && bucket_mb <= 8192,
                 "comm.bucket_mb(" + num(bucket_mb) + ") must be > 0 and <= 8192");
  problems.check(watchdog_s == 0 || watchdog_s > timeout_s,
                 "comm.watchdog_s(" + num(watchdog_s) + ") must be 0 or longer than comm.timeout_s(" +
                     num(timeout_s) + "): a rank that merely waits its deadline is not stuck");
}

std::uint64_t CommConfig::bucket_bytes() const {
  return static_cast<std::uint64_t>(bucket_mb * 1024.0 * 1024.0);
}

std::uint64_t TensorSpec::bytes() const {
  std::uint64_t n = 1;
  for (const auto d : shape) {
    WD_CHECK(d >= 0,
             "tensor '" << name << "' has a negative dimension in shape " << format_shape(shape));
    n *= static_cast<std::uint64_t>(d);
  }
  return n * c10::elementSize(dtype);
}

std::vector<std::uint64_t> MessageSpec::offsets() const {
  std::vector<std::uint64_t> out;
  out.reserve(tensors.size());
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    out.push_back(at);
    at += align_up(t.bytes());
  }
  return out;
}

std::uint64_t MessageSpec::bytes() const {
  std::uint64_t total = 0;
  for (const auto& t : tensors) total += align_up(t.bytes());
  return total;
}

std::uint64_t MessageSpec::hash() const {
  std::string text;
  for (const auto& t : tensors) {
    text += t.name + ":" + std::to_string(static_cast<int>(t.dtype)) + ":" + format_shape(t.shape) + ";";
  }
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

void check_message(const MessageSpec& spec, const TensorDict& dict, std::int64_t step, const std::string& who) {
  for (const auto& [name, tensor] : dict) {
    const bool known = std::any_of(spec.tensors.begin(), spec.tensors.end(),
                                   [&](const TensorSpec& t) { return t.name == name; });
    WD_CHECK(known, "message for " << who << " of step " << step << " has tensor '" << name
                                   << "', which the message spec lacks (spec: " << names_of(spec) << ")");
  }
  for (const auto& t : spec.tensors) {
    const auto it = dict.find(t.name);
    WD_CHECK(it != dict.end(), "message for " << who << " of step " << step << " lacks tensor '" << t.name
                                              << "' (it has: " << names_of(dict) << ")");
    WD_CHECK(it->second.defined(), "tensor '" << t.name << "' for " << who << " of step " << step << " is undefined");
    WD_CHECK(it->second.sizes() == c10::IntArrayRef(t.shape),
             "tensor '" << t.name << "' for " << who << " of step " << step << ": expected shape "
                        << format_shape(t.shape) << ", got " << format_shape(it->second.sizes()));
  }
}

std::size_t ring_slots(int prefetch_depth, std::int64_t first, std::int64_t end) {
  return static_cast<std::size_t>(std::max<std::int64_t>(1, std::min<std::int64_t>(prefetch_depth, end - first)));
}

const torch::Tensor& Message::at(const std::string& name) const {
  const auto it = tensors.find(name);
  if (it == tensors.end()) {
    throw Error("message of step " + std::to_string(step) + " has no tensor '" + name +
                "' (it has: " + names_of(tensors) + ")");
  }
  return it->second;
}

std::string student_link_name(int replica) {
  return "the teacher -> student link of replica " + std::to_string(replica);
}

std::string stage_link_name(int replica, int from_stage) {
  return "the stage " + std::to_string(from_stage) + " -> " + std::to_string(from_stage + 1) +
         " link of replica " + std::to_string(replica);
}

StreamEnd link_end(const ProcessGroups& groups, int world_rank, const CommConfig& config) {
  WD_CHECK(groups.link() != MPI_COMM_NULL,
           "rank " << world_rank
                   << " has no link to students: only a replica's last teacher stage and "
                      "the students stream batches");
  const auto& layout = groups.layout();
  const int replica = layout.replica_of(world_rank);
  StreamEnd end;
  end.comm = groups.link();
  end.world_rank = world_rank;
  end.broadcast = config.mode == "broadcast";
  end.name = student_link_name(replica);
  end.receiver = "student";
  end.sending = layout.role_of(world_rank) == Role::kTeacher;
  if (end.sending) {
    end.peers = layout.students_of_replica(replica);  // link rank 0 is the teacher
    for (std::size_t i = 0; i < end.peers.size(); ++i) end.peer_ranks.push_back(static_cast<int>(i) + 1);
  } else {
    end.peers = {layout.sender_of_replica(replica)};
    end.peer_ranks = {0};
  }
  return end;
}

StageEnds stage_ends(const ProcessGroups& groups, int world_rank) {
  const auto& layout = groups.layout();
  WD_CHECK(layout.role_of(world_rank) == Role::kTeacher,
           "rank " << world_rank << " is a student, not a teacher pipeline stage");
  const int stage = layout.stage_of(world_rank);
  const int replica = layout.replica_of(world_rank);
  // Each stage link has two ranks: the sending stage is rank 0, the receiving stage rank 1.
  StageEnds out;
  if (groups.stage_in() != MPI_COMM_NULL) {
    out.in = {groups.stage_in(), world_rank, false, {layout.teacher_of(replica, stage - 1)}, {0}, false,
              stage_link_name(replica, stage - 1)};
  }
  if (groups.stage_out() != MPI_COMM_NULL) {
    out.out = {groups.stage_out(), world_rank, true, {layout.teacher_of(replica, stage + 1)}, {1}, false,
               stage_link_name(replica, stage)};
  }
  return out;
}

std::unique_ptr<Transport> make_mpi_stream(const StreamEnd& end, const MessageSpec& spec,
                                           const CommConfig& config, std::int64_t first_step,
                                           std::int64_t end_step, bool pinned) {
  ConfigProblems problems;
  config.validate(problems);
  problems.throw_if_any("comm config");
  WD_CHECK(end.comm != MPI_COMM_NULL, "rank " << end.world_rank << " is not on " << end.name);
  const std::size_t slots = ring_slots(config.prefetch_depth, first_step, end_step);
  if (end.sending)
    return std::make_unique<MpiSender>(end, spec, config, slots, first_step, end_step, pinned);
  return std::make_unique<MpiReceiver>(end, spec, config, slots, first_step, end_step, pinned);
}

std::unique_ptr<Transport> make_mpi_transport(const ProcessGroups& groups, int world_rank,
                                              const MessageSpec& spec, const CommConfig& config,
                                              std::int64_t first_step, std::int64_t end_step,
                                              bool pinned) {
  return make_mpi_stream(link_end(groups, world_rank, config), spec, config, first_step, end_step,
                         pinned);
}

}  // namespace wd::comm
