// GroupGuard: a bracket (ncclGroupStart ... ncclGroupEnd) that is closed exactly once, also
// when an exception leaves between its ends. Generic over the calls, so its logic is tested on
// a CPU; NcclComm::group() makes the NCCL one.
#pragma once

#include <type_traits>
#include <utility>

namespace wd::comm {

/// Calls `start` on construction. end() closes the bracket on the normal path (its errors
/// propagate; the bracket counts as closed either way, as ncclGroupEnd's does). When the
/// guard is destroyed still open, an exception is leaving the scope: `unwind` closes the
/// bracket instead, and must not throw. When `start` throws, nothing is closed.
template <typename End, typename Unwind>
class GroupGuard {
  static_assert(std::is_nothrow_invocable_v<Unwind&>, "unwind runs in a destructor: mark it noexcept");

 public:
  template <typename Start>
  GroupGuard(Start&& start, End end, Unwind unwind) : end_(std::move(end)), unwind_(std::move(unwind)) {
    std::forward<Start>(start)();
    open_ = true;
  }
  ~GroupGuard() {
    if (open_) {
      open_ = false;
      unwind_();
    }
  }
  GroupGuard(const GroupGuard&) = delete;
  GroupGuard& operator=(const GroupGuard&) = delete;

  /// Closes the bracket (once; later calls do nothing).
  void end() {
    if (!open_) return;
    open_ = false;
    end_();
  }
  bool open() const { return open_; }

 private:
  End end_;
  Unwind unwind_;
  bool open_ = false;
};

template <typename Start, typename End, typename Unwind>
GroupGuard(Start&&, End, Unwind) -> GroupGuard<End, Unwind>;

}  // namespace wd::comm
