// A rank blocked in a wait leaves its core to the ranks that compute: every rank but the last
// waits ~2 s for the last one (a message, then an all-reduce, then the health barrier) and must
// use under 5% of a core meanwhile (CPU seconds over wall seconds of the wait).
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <chrono>
#include <thread>

#include "comm/health_channel.hpp"
#include "comm/mpi_runtime.hpp"

namespace wd::comm::test_idle_wait {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kLate = std::chrono::milliseconds(2000);
constexpr double kMaxBusy = 0.05;  // the bound: under 5% of a core

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// Runs `wait` on every rank but the last, which sleeps kLate first (`late`); returns this
/// rank's CPU share of the wait (0 on the late rank).
template <typename Wait, typename Late>
double busy_share(Wait&& wait, Late&& late) {
  const bool is_late = rank() == size() - 1;
  if (is_late) {
    std::this_thread::sleep_for(kLate);
    late();
    return 0;
  }
  const double cpu0 = cpu_seconds();
  const auto t0 = Clock::now();
  wait();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GT(wall, 0.5 * std::chrono::duration<double>(kLate).count()) << "the wait ended before the late rank came";
  return (cpu_seconds() - cpu0) / wall;
}

TEST(IdleWait, AReceiveWaitingForALateSenderUsesUnderFivePercentOfACore) {
  int token = 0;
  const double share = busy_share(
      [&] {
        MPI_Request req;
        ASSERT_EQ(MPI_Irecv(&token, 1, MPI_INT, size() - 1, 7, MPI_COMM_WORLD, &req), MPI_SUCCESS);
        wait_with_deadline(req, {"recv token", 0, sizeof(int), {size() - 1}}, std::chrono::seconds(30), rank(), nullptr);
      },
      [&] {
        token = 42;
        std::vector<MPI_Request> reqs(static_cast<std::size_t>(size() - 1));
        for (int r = 0; r + 1 < size(); ++r) {
          ASSERT_EQ(MPI_Isend(&token, 1, MPI_INT, r, 7, MPI_COMM_WORLD, &reqs[static_cast<std::size_t>(r)]), MPI_SUCCESS);
        }
        wait_all_with_deadline(reqs, {"send token", 0, sizeof(int), {}}, std::chrono::seconds(30), rank(), nullptr);
      });
  if (rank() + 1 < size()) {
    EXPECT_EQ(token, 42);
  }
  EXPECT_LT(share, kMaxBusy) << "rank " << rank() << " used " << 100 * share << "% of a core while waiting";
}

TEST(IdleWait, AnAllReduceWaitingForALateRankUsesUnderFivePercentOfACore) {
  std::vector<float> grads(1 << 16, 1.0f);
  const auto all_reduce = [&] {
    MPI_Request req;
    ASSERT_EQ(MPI_Iallreduce(MPI_IN_PLACE, grads.data(), static_cast<int>(grads.size()), MPI_FLOAT, MPI_SUM,
                             MPI_COMM_WORLD, &req),
              MPI_SUCCESS);
    wait_with_deadline(req, {"allreduce grads", 0, grads.size() * sizeof(float), {}}, std::chrono::seconds(30), rank(), nullptr);
  };
  const double share = busy_share(all_reduce, all_reduce);
  EXPECT_EQ(grads.front(), static_cast<float>(size()));
  EXPECT_LT(share, kMaxBusy) << "rank " << rank() << " used " << 100 * share << "% of a core while waiting";
}

TEST(IdleWait, TheHealthBarrierWaitingForALateRankUsesUnderFivePercentOfACore) {
  Topology t;
  t.rank = rank();
  t.world_size = size();
  t.role = t.rank == 0 ? Role::kTeacher : Role::kStudent;
  HealthChannel health(MPI_COMM_WORLD, t);
  const auto barrier = [&] { health.barrier("test barrier", 30); };
  const double share = busy_share(barrier, barrier);
  EXPECT_LT(share, kMaxBusy) << "rank " << rank() << " used " << 100 * share << "% of a core while waiting";
}

}  // namespace
}  // namespace wd::comm::test_idle_wait
