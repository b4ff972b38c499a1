// SendingTransport and ReceivingTransport: the ring logic of every stream.
#include "comm/ring_transport.hpp"

#include <chrono>

#include "core/errors.hpp"

namespace wd::comm {

namespace {

/// Runs `wait` and adds the seconds it took to `total`, also when it throws.
template <typename Wait>
void timed(double& total, Wait wait) {
  const auto begin = std::chrono::steady_clock::now();
  try {
    wait();
  } catch (...) {
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    throw;
  }
  total += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

std::size_t slot_of(std::int64_t step, std::int64_t first, std::size_t slots) {
  return static_cast<std::size_t>((step - first) % static_cast<std::int64_t>(slots));
}

}  // namespace

SendingTransport::SendingTransport(const StreamEnd& end, const MessageSpec& spec,
                                   std::size_t slots, std::int64_t first, std::int64_t end_step)
    : end_(end),
      spec_(spec),
      broadcast_(end.broadcast),
      first_step_(first),
      end_step_(end_step),
      next_step_(first),
      in_flight_(slots, -1) {
  WD_CHECK(end_step >= first, "transport steps [" << first << ", " << end_step << ") are empty backwards");
  WD_CHECK(end.sending && !end.peers.empty() && end.peers.size() == end.peer_ranks.size(),
           "rank " << end.world_rank << ": a sending end needs its receivers (" << end.peers.size()
                   << " world ranks, " << end.peer_ranks.size() << " communicator ranks)");
}

void SendingTransport::send(std::int64_t step, const std::vector<TensorDict>& per_receiver) {
  WD_CHECK(!broadcast_, "send(step " << step << ") scatters per-receiver slices, but "
                                     << end_.name << " is in broadcast mode; call broadcast() "
                                     << "or set comm.mode = scatter");
  WD_CHECK(per_receiver.size() == end_.peers.size(),
           "send(step " << step << ") got " << per_receiver.size() << " messages; rank "
                        << end_.world_rank << " sends to " << end_.peers.size() << " receivers");
  for (std::size_t i = 0; i < per_receiver.size(); ++i)
    check_message(spec_, per_receiver[i], step, end_.receiver + " " + std::to_string(i));
  const std::size_t slot = acquire(step);
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < per_receiver.size(); ++i) pack(slot, i, per_receiver[i]);
  start_step(slot, step);
}

void SendingTransport::broadcast(std::int64_t step, const TensorDict& message) {
  WD_CHECK(broadcast_, "broadcast(step " << step << ") needs comm.mode = broadcast: the receivers "
                                         << "of " << end_.name << " expect their own slices");
  check_message(spec_, message, step, "broadcast");
  const std::size_t slot = acquire(step);
  torch::NoGradGuard no_grad;
  pack(slot, 0, message);
  start_step(slot, step);
}

void SendingTransport::start_step(std::size_t slot, std::int64_t step) {
  start(slot, step);
  in_flight_[slot] = step;
  ++next_step_;
  // In flight and recorded: a fault here leaves sends for the backend's destructor to cancel.
  run_fault_hook(fault_hook_, "send batch", step);
}

const Message& SendingTransport::recv(std::int64_t step) {
  throw Error("recv(step " + std::to_string(step) + ") is for receiving ranks; rank " +
              std::to_string(end_.world_rank) + " sends on " + end_.name);
}

void SendingTransport::release(std::int64_t step) {
  throw Error("release(step " + std::to_string(step) + ") is for receiving ranks; rank " +
              std::to_string(end_.world_rank) + " sends on " + end_.name);
}

void SendingTransport::flush() {
  // Oldest first, so a timeout names the earliest step that is stuck.
  const auto slots = static_cast<std::int64_t>(in_flight_.size());
  for (std::int64_t step = std::max(first_step_, next_step_ - slots); step < next_step_; ++step)
    settle(slot_of(step, first_step_, in_flight_.size()));
}

std::size_t SendingTransport::acquire(std::int64_t step) {
  WD_CHECK(step == next_step_, "send of step " << step << ": the stream expects step " << next_step_
                                               << " next (steps go in order from " << first_step_ << ")");
  WD_CHECK(step < end_step_, "send of step " << step << " is past the stream's end step " << end_step_);
  progress();
  const std::size_t slot = slot_of(step, first_step_, in_flight_.size());
  settle(slot);
  return slot;
}

void SendingTransport::settle(std::size_t slot) {
  const std::int64_t step = in_flight_[slot];
  if (step < 0) return;
  timed(waited_, [&] { wait_sent(slot, step); });
  in_flight_[slot] = -1;
}

ReceivingTransport::ReceivingTransport(const StreamEnd& end, std::size_t slots, std::int64_t first,
                                       std::int64_t end_step)
    : end_(end),
      first_step_(first),
      end_step_(end_step),
      next_release_(first),
      state_(slots) {
  WD_CHECK(end_step >= first, "transport steps [" << first << ", " << end_step << ") are empty backwards");
  WD_CHECK(!end.sending && end.peers.size() == 1 && end.peer_ranks.size() == 1,
           "rank " << end.world_rank << ": a receiving end has exactly one sender");
}

void ReceivingTransport::post_ahead() {
  for (std::int64_t s = first_step_;
       s < std::min<std::int64_t>(first_step_ + static_cast<std::int64_t>(slots()), end_step_); ++s)
    post_step(s);
}

void ReceivingTransport::post_step(std::int64_t step) {
  const std::size_t slot = slot_of(step, first_step_, slots());
  post(slot, step);
  state_[slot] = {State::kPosted, step, nullptr};
}

void ReceivingTransport::sender_only(const char* what, std::int64_t step) const {
  throw Error(std::string(what) + "(step " + std::to_string(step) + ") is for the sending rank; rank " +
              std::to_string(end_.world_rank) + " receives on " + end_.name);
}

void ReceivingTransport::send(std::int64_t step, const std::vector<TensorDict>&) { sender_only("send", step); }
void ReceivingTransport::broadcast(std::int64_t step, const TensorDict&) { sender_only("broadcast", step); }
void ReceivingTransport::flush() { sender_only("flush", -1); }

const Message& ReceivingTransport::recv(std::int64_t step) {
  WD_CHECK(step >= first_step_ && step < end_step_,
           "recv(step " << step << ") is outside the stream's steps [" << first_step_ << ", "
                        << end_step_ << ")");
  const std::size_t slot = slot_of(step, first_step_, slots());
  SlotState& s = state_[slot];
  if (s.state == State::kReceived && s.step == step) return *s.held;
  WD_CHECK(s.state != State::kReceived,
           "recv(step " << step << "): step " << s.step << " still holds its ring slot; release("
                        << s.step << ") first (comm.prefetch_depth " << slots() << ")");
  WD_CHECK(s.state == State::kPosted && s.step == step,
           "recv(step " << step << "): no receive is posted for it (the oldest unreleased step is "
                        << next_release_ << ")");
  timed(waited_, [&] { wait_received(slot, step); });
  s.state = State::kIdle;  // until accept proves the payload is the step we wanted
  Message& message = accept(slot, step);
  message.step = step;
  s.held = &message;
  s.state = State::kReceived;
  return message;
}

void ReceivingTransport::release(std::int64_t step) {
  WD_CHECK(step == next_release_,
           "release(step " << step << "): steps are released in order; the oldest held step is "
                           << next_release_);
  const std::size_t slot = slot_of(step, first_step_, slots());
  WD_CHECK(state_[slot].state == State::kReceived && state_[slot].step == step,
           "release(step " << step << ") before recv(step " << step << ")");
  consumed(slot);
  state_[slot] = {State::kIdle, -1, nullptr};
  ++next_release_;
  const std::int64_t next = step + static_cast<std::int64_t>(slots());
  if (next < end_step_) post_step(next);
}

}  // namespace wd::comm
