// RingSender: the ring logic of every sending end.
#include "comm/ring_sender.hpp"

#include <algorithm>

#include "comm/ring.hpp"
#include "core/errors.hpp"

namespace wd::comm {

RingSender::RingSender(const StreamEnd& end, const MessageSpec& spec, std::size_t slots,
                       std::int64_t first, std::int64_t end_step, HealthChannel* health)
    : end_(end),
      spec_(spec),
      broadcast_(end.broadcast),
      first_step_(first),
      end_step_(end_step),
      next_step_(first),
      in_flight_(slots, -1),
      health_(health) {
  WD_CHECK(end_step >= first, "transport steps [" << first << ", " << end_step << ") are empty backwards");
  WD_CHECK(end.sending && !end.peers.empty() && end.peers.size() == end.peer_ranks.size(),
           "rank " << end.world_rank << ": a sending end needs its receivers (" << end.peers.size()
                   << " world ranks, " << end.peer_ranks.size() << " communicator ranks)");
}

void RingSender::send(std::int64_t step, const std::vector<TensorDict>& per_receiver) {
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

void RingSender::broadcast(std::int64_t step, const TensorDict& message) {
  WD_CHECK(broadcast_, "broadcast(step " << step << ") needs comm.mode = broadcast: the receivers "
                                         << "of " << end_.name << " expect their own slices");
  check_message(spec_, message, step, "broadcast");
  const std::size_t slot = acquire(step);
  torch::NoGradGuard no_grad;
  pack(slot, 0, message);
  start_step(slot, step);
}

void RingSender::start_step(std::size_t slot, std::int64_t step) {
  start(slot, step);
  in_flight_[slot] = step;
  ++next_step_;
  // In flight and recorded: a fault here leaves sends for the backend's destructor to cancel.
  run_fault_hook(fault_hook_, health_, "send batch", step);
}

void RingSender::flush() {
  // Oldest first, so a timeout names the earliest step that is stuck.
  const auto slots = static_cast<std::int64_t>(in_flight_.size());
  for (std::int64_t step = std::max(first_step_, next_step_ - slots); step < next_step_; ++step)
    settle(ring_slot_of(step, first_step_, in_flight_.size()));
}

std::size_t RingSender::acquire(std::int64_t step) {
  WD_CHECK(step == next_step_, "send of step " << step << ": the stream expects step " << next_step_
                                               << " next (steps go in order from " << first_step_ << ")");
  WD_CHECK(step < end_step_, "send of step " << step << " is past the stream's end step " << end_step_);
  progress();
  const std::size_t slot = ring_slot_of(step, first_step_, in_flight_.size());
  settle(slot);
  return slot;
}

void RingSender::settle(std::size_t slot) {
  const std::int64_t step = in_flight_[slot];
  if (step < 0) return;
  timed(waited_, [&] { wait_sent(slot, step); });
  in_flight_[slot] = -1;
}

}  // namespace wd::comm
