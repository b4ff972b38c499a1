// [comm] config, message specs, the MPI batch transport and the bucketed gradient all-reduce.
#include "comm/transport.hpp"

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <thread>

#include "comm/mpi_runtime.hpp"
#include "core/logging.hpp"

namespace wd::comm {

namespace {

using Clock = std::chrono::steady_clock;

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

/// Fields common to both ends of the link.
struct LinkBase {
  LinkBase(MPI_Comm link_comm, int world_rank, const MessageSpec& spec, const CommConfig& config,
           std::int64_t first, std::int64_t end, std::string peer_name)
      : link(link_comm),
        rank(world_rank),
        peer(std::move(peer_name)),
        spec(spec),
        offsets(spec.offsets()),
        payload(spec.bytes()),
        message_bytes(sizeof(WireHeader) + payload),
        hash(spec.hash()),
        timeout(config.timeout_s),
        first_step(first),
        end_step(end),
        slots(ring_slots(config.prefetch_depth, first, end)) {
    WD_CHECK(end >= first, "transport steps [" << first << ", " << end << ") are empty backwards");
    checked_count(message_bytes, "a batch message");
  }
  std::size_t slot_of(std::int64_t step) const {
    return static_cast<std::size_t>((step - first_step) % static_cast<std::int64_t>(slots));
  }

  MPI_Comm link;
  int rank;
  std::string peer;  ///< "teacher rank 3" / "stage 1 (rank 1)": who the other end is, for errors
  MessageSpec spec;
  std::vector<std::uint64_t> offsets;
  std::uint64_t payload;
  std::uint64_t message_bytes;
  std::uint64_t hash;
  std::chrono::duration<double> timeout;
  std::int64_t first_step, end_step;
  std::size_t slots;
  double waited = 0;
};

/// The sending teacher of a replica. Each ring slot holds one step: in scatter mode one message
/// per student, in broadcast mode a single message sent to all of them.
class MpiTeacherTransport final : public Transport {
 public:
  /// Sends to `receivers` (world ranks), which are ranks `receiver_link_ranks` of `link`.
  MpiTeacherTransport(MPI_Comm link, int world_rank, std::vector<int> receivers,
                      std::vector<int> receiver_link_ranks, const MessageSpec& spec,
                      const CommConfig& config, bool broadcast_mode, std::int64_t first,
                      std::int64_t end, bool pinned = false)
      : base_(link, world_rank, spec, config, first, end, "receivers"),
        broadcast_mode_(broadcast_mode),
        students_(std::move(receivers)),
        link_ranks_(std::move(receiver_link_ranks)),
        next_step_(first) {
    WD_CHECK(students_.size() == link_ranks_.size() && !students_.empty(),
             "rank " << world_rank << ": " << students_.size() << " receivers with "
                     << link_ranks_.size() << " link ranks");
    const std::size_t messages = broadcast_mode_ ? 1 : students_.size();
    ring_.resize(base_.slots);
    for (auto& slot : ring_) {
      slot.buffer = torch::empty({static_cast<std::int64_t>(messages * base_.message_bytes)},
                                 host_buffer_options(pinned));
      auto* bytes = slot.buffer.data_ptr<std::uint8_t>();
      for (std::size_t m = 0; m < messages; ++m) {
        slot.views.push_back(make_views(base_.spec, base_.offsets,
                                        bytes + m * base_.message_bytes + sizeof(WireHeader),
                                        slot.buffer));
      }
      slot.requests.assign(students_.size(), MPI_REQUEST_NULL);
    }
  }

  ~MpiTeacherTransport() override {
    std::vector<MPI_Request*> pending;
    for (auto& slot : ring_) {
      for (auto& r : slot.requests) pending.push_back(&r);
    }
    if (!cancel_and_settle(pending)) {
      for (auto& slot : ring_) keep_until_exit(slot.buffer);
    }
  }

  void send(std::int64_t step, const std::vector<TensorDict>& per_student) override {
    WD_CHECK(!broadcast_mode_, "send(step " << step << ") scatters per-student slices, but "
                                            << "comm.mode is broadcast; call broadcast() or set "
                                            << "comm.mode = scatter");
    WD_CHECK(per_student.size() == students_.size(),
             "send(step " << step << ") got " << per_student.size() << " messages; rank "
                          << base_.rank << " sends to " << students_.size() << " receivers");
    Slot& slot = acquire(step);
    for (std::size_t i = 0; i < students_.size(); ++i) {
      pack(slot, i, step, per_student[i], "student " + std::to_string(i));
    }
    start_sends(slot, step, /*shared=*/false);
  }

  void broadcast(std::int64_t step, const TensorDict& message) override {
    Slot& slot = acquire(step);
    pack(slot, 0, step, message, "broadcast");
    start_sends(slot, step, /*shared=*/true);
  }

  const Message& recv(std::int64_t step) override {
    throw Error("recv(step " + std::to_string(step) + ") is for student ranks; rank " +
                std::to_string(base_.rank) + " is a teacher");
  }
  void release(std::int64_t step) override {
    throw Error("release(step " + std::to_string(step) + ") is for student ranks; rank " +
                std::to_string(base_.rank) + " is a teacher");
  }

  void flush() override {
    // Oldest first, so a timeout names the earliest step that is stuck.
    for (std::int64_t step = next_step_ - static_cast<std::int64_t>(base_.slots); step < next_step_;
         ++step) {
      if (step < base_.first_step) continue;
      wait_slot(ring_[base_.slot_of(step)]);
    }
  }

  double wait_seconds() const override { return base_.waited; }

 private:
  struct Slot {
    torch::Tensor buffer;
    std::vector<std::vector<torch::Tensor>> views;  ///< [message][tensor]
    std::vector<MPI_Request> requests;              ///< one per student
    std::int64_t step = -1;
    std::uint64_t sent_bytes = 0;
  };

  /// The slot for `step`, once the sends of the step that used it before have completed.
  Slot& acquire(std::int64_t step) {
    WD_CHECK(step == next_step_, "send of step " << step << ": the stream expects step "
                                                 << next_step_ << " next (steps go in order from "
                                                 << base_.first_step << ")");
    WD_CHECK(step < base_.end_step,
             "send of step " << step << " is past the stream's end step " << base_.end_step);
    // Testing the other slots drives MPI's progress engine for large (rendezvous) messages
    // while the teacher is otherwise busy computing.
    for (auto& s : ring_) {
      int done = 0;
      WD_CHECK_MPI(MPI_Testall(static_cast<int>(s.requests.size()), s.requests.data(), &done,
                               MPI_STATUSES_IGNORE));
    }
    Slot& slot = ring_[base_.slot_of(step)];
    wait_slot(slot);
    return slot;
  }

  void wait_slot(Slot& slot) {
    const bool busy = std::any_of(slot.requests.begin(), slot.requests.end(),
                                  [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
    if (!busy) return;
    WaitInfo info{"send batch", slot.step, slot.sent_bytes, students_, /*peer_per_request=*/true};
    const auto start = Clock::now();
    try {
      wait_all_with_deadline(slot.requests, info, base_.timeout, base_.rank);
    } catch (...) {
      base_.waited += std::chrono::duration<double>(Clock::now() - start).count();
      throw;
    }
    base_.waited += std::chrono::duration<double>(Clock::now() - start).count();
  }

  void pack(Slot& slot, std::size_t message, std::int64_t step, const TensorDict& dict,
            const std::string& who) {
    torch::NoGradGuard no_grad;
    check_message(base_.spec, dict, step, who);
    for (std::size_t i = 0; i < base_.spec.tensors.size(); ++i) {
      // copy_ converts to the spec dtype and brings device tensors to the host.
      slot.views[message][i].copy_(dict.at(base_.spec.tensors[i].name));
    }
    write_header(slot.buffer.data_ptr<std::uint8_t>() + message * base_.message_bytes, step,
                 base_.payload, base_.hash);
  }

  void start_sends(Slot& slot, std::int64_t step, bool shared) {
    slot.step = step;
    slot.sent_bytes = base_.message_bytes * students_.size();
    const int count = static_cast<int>(base_.message_bytes);
    auto* bytes = slot.buffer.data_ptr<std::uint8_t>();
    for (std::size_t i = 0; i < students_.size(); ++i) {
      std::uint8_t* message = bytes + (shared ? 0 : i * base_.message_bytes);
      WD_CHECK_MPI(MPI_Isend(message, count, MPI_BYTE, link_ranks_[i], kTag, base_.link,
                             &slot.requests[i]));
    }
    ++next_step_;
  }

  LinkBase base_;
  bool broadcast_mode_;
  std::vector<int> students_;    ///< world ranks of the receivers, in message order
  std::vector<int> link_ranks_;  ///< their ranks in the link communicator
  std::vector<Slot> ring_;
  std::int64_t next_step_;
};

/// A student: receives into a ring of preallocated buffers, `slots` steps ahead. Steps are
/// released in order, so receives are always posted in step order and MPI's non-overtaking rule
/// delivers step s into the slot posted for s.
class MpiStudentTransport final : public Transport {
 public:
  /// Receives from world rank `sender`, which is rank `sender_link_rank` of `link`.
  MpiStudentTransport(MPI_Comm link, int world_rank, int sender, int sender_link_rank,
                      const MessageSpec& spec, const CommConfig& config, std::int64_t first,
                      std::int64_t end, bool pinned = false)
      : base_(link, world_rank, spec, config, first, end, "teacher rank " + std::to_string(sender)),
        teacher_(sender),
        sender_link_rank_(sender_link_rank),
        next_release_(first) {
    ring_.resize(base_.slots);
    for (auto& slot : ring_) {
      slot.buffer = torch::empty({static_cast<std::int64_t>(base_.message_bytes)},
                                 host_buffer_options(pinned));
      const auto views =
          make_views(base_.spec, base_.offsets,
                     slot.buffer.data_ptr<std::uint8_t>() + sizeof(WireHeader), slot.buffer);
      for (std::size_t i = 0; i < views.size(); ++i)
        slot.message.tensors[base_.spec.tensors[i].name] = views[i];
    }
    try {
      for (std::int64_t s = first; s < std::min<std::int64_t>(first + base_.slots, end); ++s)
        post(s);
    } catch (...) {
      retire();
      throw;
    }
  }

  ~MpiStudentTransport() override { retire(); }

  void send(std::int64_t step, const std::vector<TensorDict>&) override {
    teacher_only("send", step);
  }
  void broadcast(std::int64_t step, const TensorDict&) override { teacher_only("broadcast", step); }
  void flush() override { teacher_only("flush", -1); }

  const Message& recv(std::int64_t step) override {
    WD_CHECK(step >= base_.first_step && step < base_.end_step,
             "recv(step " << step << ") is outside the stream's steps [" << base_.first_step << ", "
                          << base_.end_step << ")");
    Slot& slot = ring_[base_.slot_of(step)];
    if (slot.state == State::kReceived && slot.message.step == step) return slot.message;
    WD_CHECK(slot.state != State::kReceived,
             "recv(step " << step << "): step " << slot.message.step
                          << " still holds its ring slot; release(" << slot.message.step
                          << ") first (comm.prefetch_depth " << base_.slots << ")");
    WD_CHECK(slot.state == State::kPosted && slot.posted_step == step,
             "recv(step " << step
                          << "): no receive is posted for it (the oldest unreleased step is "
                          << next_release_ << ")");
    WaitInfo info{"recv batch", step, base_.message_bytes, {teacher_}};
    const auto start = Clock::now();
    try {
      wait_with_deadline(slot.request, info, base_.timeout, base_.rank);
    } catch (const TimeoutError&) {
      base_.waited += std::chrono::duration<double>(Clock::now() - start).count();
      throw;
    } catch (const MpiError& e) {
      throw MpiError("recv batch of step " + std::to_string(step) + " from teacher rank " +
                     std::to_string(teacher_) + ": " + e.what());
    }
    base_.waited += std::chrono::duration<double>(Clock::now() - start).count();
    slot.state = State::kIdle;  // until the header proves the payload is the step we wanted
    check_header(slot, step);
    slot.state = State::kReceived;
    slot.message.step = step;
    return slot.message;
  }

  void release(std::int64_t step) override {
    WD_CHECK(step == next_release_,
             "release(step " << step << "): steps are released in order; the oldest held step is "
                             << next_release_);
    Slot& slot = ring_[base_.slot_of(step)];
    WD_CHECK(slot.state == State::kReceived && slot.message.step == step,
             "release(step " << step << ") before recv(step " << step << ")");
    slot.state = State::kIdle;
    ++next_release_;
    const std::int64_t next = step + static_cast<std::int64_t>(base_.slots);
    if (next < base_.end_step) post(next);
  }

  double wait_seconds() const override { return base_.waited; }

 private:
  enum class State { kIdle, kPosted, kReceived };
  struct Slot {
    torch::Tensor buffer;  ///< header + payload; the message's tensors view it
    Message message;
    MPI_Request request = MPI_REQUEST_NULL;
    State state = State::kIdle;
    std::int64_t posted_step = -1;
  };

  [[noreturn]] void teacher_only(const char* what, std::int64_t step) const {
    throw Error(std::string(what) + "(step " + std::to_string(step) +
                ") is for the sending teacher; rank " + std::to_string(base_.rank) +
                " is a student");
  }

  void post(std::int64_t step) {
    Slot& slot = ring_[base_.slot_of(step)];
    WD_CHECK_MPI(MPI_Irecv(slot.buffer.data_ptr(), static_cast<int>(base_.message_bytes), MPI_BYTE,
                           sender_link_rank_, kTag, base_.link, &slot.request));
    slot.state = State::kPosted;
    slot.posted_step = step;
  }

  void check_header(const Slot& slot, std::int64_t step) const {
    WireHeader h{};
    std::memcpy(&h, slot.buffer.data_ptr(), sizeof h);
    const std::string from = "batch for step " + std::to_string(step) + " from teacher rank " +
                             std::to_string(teacher_) + " on rank " + std::to_string(base_.rank);
    if (h.magic != kMagic) {
      std::ostringstream os;
      os << from << ": bad header magic 0x" << std::hex << h.magic << " (expected 0x" << kMagic
         << "); the stream is out of sync";
      throw Error(os.str());
    }
    WD_CHECK(h.payload_bytes == base_.payload && h.spec_hash == base_.hash,
             from << ": the teacher's message spec (" << h.payload_bytes
                  << " payload bytes) differs from "
                  << "this student's (" << base_.payload << " payload bytes, tensors "
                  << names_of(base_.spec) << ")");
    WD_CHECK(h.step == step, from << ": received step " << h.step << " where step " << step
                                  << " was expected; the stream is out of order");
  }

  /// Cancels the receives still posted (a run that ends early or fails).
  void retire() noexcept {
    std::vector<MPI_Request*> pending;
    for (auto& slot : ring_) pending.push_back(&slot.request);
    if (!cancel_and_settle(pending)) {
      for (auto& slot : ring_) keep_until_exit(slot.buffer);
    }
    for (auto& slot : ring_) slot.state = State::kIdle;
  }

  LinkBase base_;
  int teacher_;           ///< world rank of the sender (a teacher, or the previous stage)
  int sender_link_rank_;  ///< its rank in the link communicator
  std::vector<Slot> ring_;
  std::int64_t next_release_;
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

std::unique_ptr<Transport> make_mpi_transport(const ProcessGroups& groups, int world_rank,
                                              const MessageSpec& spec, const CommConfig& config,
                                              std::int64_t first_step, std::int64_t end_step,
                                              bool pinned) {
  ConfigProblems problems;
  config.validate(problems);
  problems.throw_if_any("comm config");
  WD_CHECK(groups.link() != MPI_COMM_NULL,
           "rank " << world_rank
                   << " has no link to students: only a replica's last teacher stage and "
                      "the students stream batches");
  const auto& layout = groups.layout();
  const int replica = layout.replica_of(world_rank);
  if (layout.role_of(world_rank) == Role::kTeacher) {
    auto students = layout.students_of_replica(replica);
    std::vector<int> link_ranks;  // link rank 0 is the teacher, students follow in slot order
    for (std::size_t i = 0; i < students.size(); ++i) link_ranks.push_back(static_cast<int>(i) + 1);
    return std::make_unique<MpiTeacherTransport>(groups.link(), world_rank, std::move(students),
                                                 std::move(link_ranks), spec, config,
                                                 config.mode == "broadcast", first_step, end_step,
                                                 pinned);
  }
  return std::make_unique<MpiStudentTransport>(groups.link(), world_rank,
                                               layout.sender_of_replica(replica), 0, spec, config,
                                               first_step, end_step, pinned);
}

StageTransports make_mpi_stage_transports(const ProcessGroups& groups, int world_rank,
                                          const MessageSpec& from_previous,
                                          const MessageSpec& to_next, const CommConfig& config,
                                          std::int64_t first_step, std::int64_t end_step) {
  ConfigProblems problems;
  config.validate(problems);
  problems.throw_if_any("comm config");
  const auto& layout = groups.layout();
  WD_CHECK(layout.role_of(world_rank) == Role::kTeacher && groups.pipeline() != MPI_COMM_NULL,
           "rank " << world_rank << " is not a teacher pipeline stage");
  const int stage = layout.stage_of(world_rank);
  StageTransports out;
  // Every stage of a replica is in one pipeline communicator, keyed by stage; stage k sends
  // to k + 1 only, so one tag serves both directions (MPI matches on the source).
  if (stage > 0) {
    out.from_previous = std::make_unique<MpiStudentTransport>(
        groups.pipeline(), world_rank, world_rank - 1, stage - 1, from_previous, config,
        first_step, end_step);
  }
  if (stage + 1 < layout.stages) {
    out.to_next = std::make_unique<MpiTeacherTransport>(
        groups.pipeline(), world_rank, std::vector<int>{world_rank + 1}, std::vector<int>{stage + 1},
        to_next, config, /*broadcast_mode=*/false, first_step, end_step);
  }
  return out;
}

}  // namespace wd::comm
