// GroupGuard, the bracket NcclComm::group() puts around ncclGroupStart/End: closed exactly once,
// by end() on the normal path and by the unwind call when an exception leaves first.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "comm/group_guard.hpp"

namespace wd::comm::test_group_guard {
namespace {

/// Imitates NCCL's per-thread group depth and records every call.
struct Bracket {
  int depth = 0;
  std::string calls;
  bool end_throws = false;
  auto guard(bool start_throws = false) {
    return GroupGuard(
        [this, start_throws] {
          calls += "start ";
          if (start_throws) throw std::runtime_error("start failed");
          ++depth;
        },
        [this] {
          calls += "end ";
          --depth;  // ncclGroupEnd leaves the group even when it reports an error
          if (end_throws) throw std::runtime_error("end failed");
        },
        [this]() noexcept {
          calls += "unwind ";
          --depth;
        });
  }
};

TEST(GroupGuard, TheNormalPathEndsOnceAndNeverUnwinds) {
  Bracket b;
  {
    auto g = b.guard();
    EXPECT_TRUE(g.open());
    EXPECT_EQ(b.depth, 1);
    g.end();
    EXPECT_FALSE(g.open());
    g.end();  // a second end does nothing
  }
  EXPECT_EQ(b.calls, "start end ");
  EXPECT_EQ(b.depth, 0);
}

TEST(GroupGuard, AnExceptionInsideTheGroupUnwindsIt) {
  Bracket b;
  try {
    auto g = b.guard();
    throw std::runtime_error("send failed");  // as NcclComm::send between start and end
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "send failed") << "the exception on its way is the one reported";
  }
  EXPECT_EQ(b.calls, "start unwind ");
  EXPECT_EQ(b.depth, 0);
}

TEST(GroupGuard, AFailingEndIsNotFollowedByAnUnwind) {
  Bracket b;
  b.end_throws = true;
  EXPECT_THROW(
      {
        auto g = b.guard();
        g.end();
      },
      std::runtime_error);
  EXPECT_EQ(b.calls, "start end ");
  EXPECT_EQ(b.depth, 0);
}

TEST(GroupGuard, AFailedStartClosesNothing) {
  Bracket b;
  EXPECT_THROW(b.guard(/*start_throws=*/true), std::runtime_error);
  EXPECT_EQ(b.calls, "start ");
  EXPECT_EQ(b.depth, 0);
}

TEST(GroupGuard, NestedGroupsCloseInnermostFirst) {
  Bracket b;
  try {
    auto outer = b.guard();
    auto inner = b.guard();
    inner.end();
    EXPECT_EQ(b.depth, 1);
    throw std::runtime_error("between the ends of the outer group");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(b.calls, "start start end unwind ");
  EXPECT_EQ(b.depth, 0);
}

}  // namespace
}  // namespace wd::comm::test_group_guard
