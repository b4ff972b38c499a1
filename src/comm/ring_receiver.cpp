// RingReceiver: the ring logic of every receiving end.
#include "comm/ring_receiver.hpp"

#include <algorithm>

#include "comm/ring.hpp"
#include "comm/wait.hpp"
#include "core/errors.hpp"

namespace wd::comm {

RingReceiver::RingReceiver(const StreamEnd& end, std::size_t slots, std::int64_t first,
                           std::int64_t end_step, HealthChannel* health)
    : end_(end),
      first_step_(first),
      end_step_(end_step),
      next_release_(first),
      state_(slots),
      health_(health) {
  WD_CHECK(end_step >= first, "transport steps [" << first << ", " << end_step << ") are empty backwards");
  WD_CHECK(!end.sending && end.peers.size() == 1 && end.peer_ranks.size() == 1,
           "rank " << end.world_rank << ": a receiving end has exactly one sender");
}

void RingReceiver::post_ahead() {
  for (std::int64_t s = first_step_;
       s < std::min<std::int64_t>(first_step_ + static_cast<std::int64_t>(slots()), end_step_); ++s)
    post_step(s);
}

void RingReceiver::post_step(std::int64_t step) {
  const std::size_t slot = ring_slot_of(step, first_step_, slots());
  post(slot, step);
  state_[slot] = {State::kPosted, step, nullptr};
}

const Message& RingReceiver::recv(std::int64_t step) {
  WD_CHECK(step >= first_step_ && step < end_step_,
           "recv(step " << step << ") is outside the stream's steps [" << first_step_ << ", "
                        << end_step_ << ")");
  const std::size_t slot = ring_slot_of(step, first_step_, slots());
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

void RingReceiver::release(std::int64_t step) {
  WD_CHECK(step == next_release_,
           "release(step " << step << "): steps are released in order; the oldest held step is "
                           << next_release_);
  const std::size_t slot = ring_slot_of(step, first_step_, slots());
  WD_CHECK(state_[slot].state == State::kReceived && state_[slot].step == step,
           "release(step " << step << ") before recv(step " << step << ")");
  consumed(slot);
  state_[slot] = {State::kIdle, -1, nullptr};
  ++next_release_;
  const std::int64_t next = step + static_cast<std::int64_t>(slots());
  if (next < end_step_) post_step(next);
}

}  // namespace wd::comm
