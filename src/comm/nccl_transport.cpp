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
#include "comm/startup.hpp"
#include "comm/transport_factory.hpp"
#include "core/logging.hpp"

namespace wd::comm {

namespace {

using Clock = std::chrono::steady_clock;

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

/// What both ends of a link share: the device, the comm stream, the NCCL communicator, the
/// ring geometry. Member order matters: the communicator is destroyed before the stream and
/// the ring buffers (declared in the subclasses before `link`), so an abort stops the kernels
/// before their memory goes back to the caching allocator.
struct LinkSetup {
  LinkSetup(const ProcessGroups& groups, int world_rank, const MessageSpec& spec,
            const CommConfig& config, std::int64_t first, std::int64_t end, const c10::Device& device)
      : rank(world_rank),
        layout(groups.layout()),
        spec(spec),
        payload(spec.bytes()),
        index(device.has_index() ? device.index() : c10::cuda::current_device()),
        timeout(config.timeout_s),
        first_step(first),
        end_step(end),
        slots(ring_slots(config.prefetch_depth, first, end)),
        options(torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA, index)) {
    WD_CHECK(end >= first, "transport steps [" << first << ", " << end << ") are empty backwards");
    WD_CHECK(groups.link() != MPI_COMM_NULL,
             "rank " << world_rank << " has no link to students: only a replica's last teacher "
                                      "stage and the students stream batches");
  }
  std::size_t slot_of(std::int64_t step) const {
    return static_cast<std::size_t>((step - first_step) % static_cast<std::int64_t>(slots));
  }
  /// torch's current stream on this device: the compute that produces or consumes messages.
  cudaStream_t compute_stream() const { return c10::cuda::getCurrentCUDAStream(index).stream(); }

  int rank;
  Layout layout;
  MessageSpec spec;
  std::uint64_t payload;
  c10::DeviceIndex index;
  std::chrono::duration<double> timeout;
  std::int64_t first_step, end_step;
  std::size_t slots;
  torch::TensorOptions options;
  double waited = 0;
};

/// Teacher and students agree on the message spec (with deadline) before NCCL starts.
void agree_on_spec(const LinkSetup& s, MPI_Comm link, int link_rank) {
  std::vector<std::int64_t> theirs{spec_hash(s.spec), static_cast<std::int64_t>(s.payload)};
  broadcast_ints(theirs, 0, link, s.timeout.count(), "NCCL transport message spec");
  std::exception_ptr problem;
  if (link_rank != 0 && (theirs[0] != spec_hash(s.spec) ||
                         theirs[1] != static_cast<std::int64_t>(s.payload))) {
    problem = std::make_exception_ptr(Error(
        "rank " + std::to_string(s.rank) + ": the teacher's message spec (" +
        std::to_string(theirs[1]) + " payload bytes) differs from this student's (" +
        std::to_string(s.payload) + " payload bytes)"));
  }
  agree_on_startup("NCCL transport message spec", problem, link, s.timeout.count());
}

int link_rank_of(MPI_Comm link) {
  int r = 0;
  WD_CHECK_MPI(MPI_Comm_rank(link, &r));
  return r;
}

class NcclTeacherTransport final : public Transport {
 public:
  NcclTeacherTransport(const ProcessGroups& groups, int world_rank, const MessageSpec& spec,
                       const CommConfig& config, std::int64_t first, std::int64_t end,
                       const c10::Device& device)
      : s_(groups, world_rank, spec, config, first, end, device),
        broadcast_mode_(config.mode == "broadcast"),
        students_(s_.layout.students_of_replica(s_.layout.replica_of(world_rank))),
        next_step_(first),
        stream_(s_.index) {
    agree_on_spec(s_, groups.link(), link_rank_of(groups.link()));
    const std::size_t messages = broadcast_mode_ ? 1 : students_.size();
    for (std::size_t i = 0; i < s_.slots; ++i) {
      Slot slot{torch::empty({static_cast<std::int64_t>(messages * s_.payload)}, s_.options),
                {}, CudaEvent(s_.index), CudaEvent(s_.index)};
      for (std::size_t m = 0; m < messages; ++m)
        slot.views.push_back(make_views(s_.spec, slot.buffer, static_cast<std::int64_t>(m * s_.payload)));
      ring_.push_back(std::move(slot));
    }
    link_.emplace(groups.link(), s_.index, config.timeout_s);
    WD_CHECK(link_->size() == static_cast<int>(students_.size()) + 1,
             "link of rank " << world_rank << " has " << link_->size()
                             << " ranks, expected 1 teacher + " << students_.size() << " students");
  }

  void send(std::int64_t step, const std::vector<TensorDict>& per_student) override {
    WD_CHECK(!broadcast_mode_, "send(step " << step << ") scatters per-student slices, but "
                                            << "comm.mode is broadcast; call broadcast() or set "
                                            << "comm.mode = scatter");
    WD_CHECK(per_student.size() == students_.size(),
             "send(step " << step << ") got " << per_student.size() << " student messages; replica "
                          << s_.layout.replica_of(s_.rank) << " serves " << students_.size()
                          << " students");
    Slot& slot = acquire(step);
    for (std::size_t i = 0; i < students_.size(); ++i)
      pack(slot, i, step, per_student[i], "student " + std::to_string(i));
    start(slot, step, [&] {
      link_->group_start();  // one fused launch: the students' sends proceed in parallel
      for (std::size_t i = 0; i < students_.size(); ++i) {
        link_->send(slot.buffer.data_ptr<std::uint8_t>() + i * s_.payload, s_.payload,
                    static_cast<int>(i) + 1, stream_.get());
      }
      link_->group_end();
    });
  }

  void broadcast(std::int64_t step, const TensorDict& message) override {
    WD_CHECK(broadcast_mode_, "broadcast(step " << step << ") needs comm.mode = broadcast: the "
                                                << "students post receives for their own slices");
    Slot& slot = acquire(step);
    pack(slot, 0, step, message, "broadcast");
    start(slot, step, [&] {
      void* data = slot.buffer.data_ptr();
      link_->broadcast(data, data, s_.payload, 0, stream_.get());
    });
  }

  const Message& recv(std::int64_t step) override {
    throw Error("recv(step " + std::to_string(step) + ") is for student ranks; rank " +
                std::to_string(s_.rank) + " is a teacher");
  }
  void release(std::int64_t step) override {
    throw Error("release(step " + std::to_string(step) + ") is for student ranks; rank " +
                std::to_string(s_.rank) + " is a teacher");
  }

  void flush() override {
    for (std::int64_t step = next_step_ - static_cast<std::int64_t>(s_.slots); step < next_step_;
         ++step) {
      if (step >= s_.first_step) wait_slot(ring_[s_.slot_of(step)]);
    }
  }

  double wait_seconds() const override { return s_.waited; }

 private:
  struct Slot {
    torch::Tensor buffer;                           ///< [message][payload] bytes on the device
    std::vector<std::vector<torch::Tensor>> views;  ///< [message][tensor]
    CudaEvent packed;                               ///< on the compute stream, after the copies
    CudaEvent sent;                                 ///< on the comm stream, after the sends
    std::int64_t step = -1;
    bool busy = false;
  };

  Slot& acquire(std::int64_t step) {
    WD_CHECK(step == next_step_, "send of step " << step << ": the stream expects step "
                                                 << next_step_ << " next (steps go in order from "
                                                 << s_.first_step << ")");
    WD_CHECK(step < s_.end_step,
             "send of step " << step << " is past the stream's end step " << s_.end_step);
    Slot& slot = ring_[s_.slot_of(step)];
    wait_slot(slot);  // the sends of the step that used this slot have left it
    return slot;
  }

  void wait_slot(Slot& slot) {
    if (!slot.busy) return;
    const auto begin = Clock::now();
    try {
      link_->wait(slot.sent.get(),
                  WaitInfo{"send batch", slot.step, s_.payload * students_.size(), students_},
                  s_.timeout);
    } catch (...) {
      s_.waited += std::chrono::duration<double>(Clock::now() - begin).count();
      throw;
    }
    s_.waited += std::chrono::duration<double>(Clock::now() - begin).count();
    slot.busy = false;
  }

  /// Copies (and converts) a message into the slot on torch's current stream, like the MPI
  /// transport's pack; host tensors are uploaded by the same copy.
  void pack(Slot& slot, std::size_t message, std::int64_t step, const TensorDict& dict,
            const std::string& who) {
    torch::NoGradGuard no_grad;
    const c10::cuda::CUDAGuard guard(s_.index);
    check_message(s_.spec, dict, step, who);
    for (std::size_t i = 0; i < s_.spec.tensors.size(); ++i) {
      slot.views[message][i].copy_(dict.at(s_.spec.tensors[i].name), /*non_blocking=*/true);
    }
  }

  /// Orders the sends after the copies (an event, not a host sync), issues them on the comm
  /// stream and marks the slot busy until `sent` completes.
  template <typename Issue>
  void start(Slot& slot, std::int64_t step, Issue issue) {
    slot.packed.record(s_.compute_stream());
    slot.packed.block(stream_.get());
    issue();
    slot.sent.record(stream_.get());
    slot.step = step;
    slot.busy = true;
    ++next_step_;
  }

  LinkSetup s_;
  bool broadcast_mode_;
  std::vector<int> students_;  ///< world ranks; link rank = slot + 1
  std::int64_t next_step_;
  CudaStream stream_;
  std::vector<Slot> ring_;
  std::optional<NcclComm> link_;  ///< last: destroyed (or aborted) first
};

class NcclStudentTransport final : public Transport {
 public:
  NcclStudentTransport(const ProcessGroups& groups, int world_rank, const MessageSpec& spec,
                       const CommConfig& config, std::int64_t first, std::int64_t end,
                       const c10::Device& device)
      : s_(groups, world_rank, spec, config, first, end, device),
        broadcast_mode_(config.mode == "broadcast"),
        teacher_(s_.layout.sender_of_replica(s_.layout.replica_of(world_rank))),
        next_release_(first),
        stream_(s_.index) {
    agree_on_spec(s_, groups.link(), link_rank_of(groups.link()));
    for (std::size_t i = 0; i < s_.slots; ++i) {
      Slot slot{torch::empty({static_cast<std::int64_t>(s_.payload)}, s_.options), {},
                CudaEvent(s_.index), CudaEvent(s_.index)};
      const auto views = make_views(s_.spec, slot.buffer, 0);
      for (std::size_t v = 0; v < views.size(); ++v)
        slot.message.tensors[s_.spec.tensors[v].name] = views[v];
      ring_.push_back(std::move(slot));
    }
    link_.emplace(groups.link(), s_.index, config.timeout_s);
    for (std::int64_t step = first; step < std::min<std::int64_t>(first + s_.slots, end); ++step)
      post(step);
  }

  void send(std::int64_t step, const std::vector<TensorDict>&) override { teacher_only("send", step); }
  void broadcast(std::int64_t step, const TensorDict&) override { teacher_only("broadcast", step); }
  void flush() override { teacher_only("flush", -1); }

  const Message& recv(std::int64_t step) override {
    WD_CHECK(step >= s_.first_step && step < s_.end_step,
             "recv(step " << step << ") is outside the stream's steps [" << s_.first_step << ", "
                          << s_.end_step << ")");
    Slot& slot = ring_[s_.slot_of(step)];
    if (slot.state == State::kReceived && slot.message.step == step) return slot.message;
    WD_CHECK(slot.state != State::kReceived,
             "recv(step " << step << "): step " << slot.message.step
                          << " still holds its ring slot; release(" << slot.message.step
                          << ") first (comm.prefetch_depth " << s_.slots << ")");
    WD_CHECK(slot.state == State::kPosted && slot.posted_step == step,
             "recv(step " << step << "): no receive is posted for it (the oldest unreleased step is "
                          << next_release_ << ")");
    const auto begin = Clock::now();
    try {
      link_->wait(slot.received.get(), WaitInfo{"recv batch", step, s_.payload, {teacher_}},
                  s_.timeout);
    } catch (...) {
      s_.waited += std::chrono::duration<double>(Clock::now() - begin).count();
      throw;
    }
    s_.waited += std::chrono::duration<double>(Clock::now() - begin).count();
    // Already complete on the host; the device-side wait keeps the order explicit for torch's
    // stream should the host wait ever be dropped.
    slot.received.block(s_.compute_stream());
    slot.state = State::kReceived;
    slot.message.step = step;
    return slot.message;
  }

  void release(std::int64_t step) override {
    WD_CHECK(step == next_release_,
             "release(step " << step << "): steps are released in order; the oldest held step is "
                             << next_release_);
    Slot& slot = ring_[s_.slot_of(step)];
    WD_CHECK(slot.state == State::kReceived && slot.message.step == step,
             "release(step " << step << ") before recv(step " << step << ")");
    // The compute queued so far may still read the views: the next receive into this slot
    // waits for it on the device.
    slot.consumed.record(s_.compute_stream());
    slot.state = State::kIdle;
    slot.reused = true;
    ++next_release_;
    const std::int64_t next = step + static_cast<std::int64_t>(s_.slots);
    if (next < s_.end_step) post(next);
  }

  double wait_seconds() const override { return s_.waited; }

 private:
  enum class State { kIdle, kPosted, kReceived };
  struct Slot {
    torch::Tensor buffer;
    Message message;
    CudaEvent received;  ///< on the comm stream, after the receive
    CudaEvent consumed;  ///< on the compute stream, at release
    State state = State::kIdle;
    std::int64_t posted_step = -1;
    bool reused = false;
  };

  [[noreturn]] void teacher_only(const char* what, std::int64_t step) const {
    throw Error(std::string(what) + "(step " + std::to_string(step) +
                ") is for the sending teacher; rank " + std::to_string(s_.rank) + " is a student");
  }

  /// Posts the receive of `step`. Posts happen in step order (release is in order), and NCCL
  /// matches a pair's operations in issue order, so step s lands in the slot posted for s.
  void post(std::int64_t step) {
    Slot& slot = ring_[s_.slot_of(step)];
    if (slot.reused) slot.consumed.block(stream_.get());
    void* data = slot.buffer.data_ptr();
    if (broadcast_mode_) {
      link_->broadcast(data, data, s_.payload, 0, stream_.get());
    } else {
      link_->recv(data, s_.payload, 0, stream_.get());
    }
    slot.received.record(stream_.get());
    slot.state = State::kPosted;
    slot.posted_step = step;
  }

  LinkSetup s_;
  bool broadcast_mode_;
  int teacher_;
  std::int64_t next_release_;
  CudaStream stream_;
  std::vector<Slot> ring_;
  std::optional<NcclComm> link_;  ///< last: destroyed (or aborted) first
};

}  // namespace

bool nccl_built() { return true; }

std::unique_ptr<Transport> make_nccl_transport(const ProcessGroups& groups, int world_rank,
                                               const MessageSpec& spec, const CommConfig& config,
                                               std::int64_t first_step, std::int64_t end_step,
                                               const c10::Device& device) {
  ConfigProblems problems;
  config.validate(problems);
  problems.throw_if_any("comm config");
  WD_CHECK_AS(ConfigError, device.is_cuda(),
              "the NCCL transport streams CUDA tensors; rank " << world_rank << " asked for "
                                                               << device.str());
  if (groups.layout().role_of(world_rank) == Role::kTeacher) {
    return std::make_unique<NcclTeacherTransport>(groups, world_rank, spec, config, first_step,
                                                  end_step, device);
  }
  return std::make_unique<NcclStudentTransport>(groups, world_rank, spec, config, first_step,
                                                end_step, device);
}

}  // namespace wd::comm
