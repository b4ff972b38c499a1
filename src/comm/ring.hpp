// The ring geometry both ends of a stream share: how many slots, and which slot holds a step.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace wd::comm {

/// Slots of a stream's ring: comm.prefetch_depth, at least one, at most the steps [first, end).
inline std::size_t ring_slots(int prefetch_depth, std::int64_t first, std::int64_t end) {
  return static_cast<std::size_t>(std::max<std::int64_t>(1, std::min<std::int64_t>(prefetch_depth, end - first)));
}

/// The slot of `step` in a ring of `slots` slots whose first step is `first`.
inline std::size_t ring_slot_of(std::int64_t step, std::int64_t first, std::size_t slots) {
  return static_cast<std::size_t>((step - first) % static_cast<std::int64_t>(slots));
}

}  // namespace wd::comm
