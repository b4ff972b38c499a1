// GoogleTest main for N-rank tests: the global environment owns MPI; all ranks share a verdict.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "comm/mpi_runtime.hpp"

namespace {

/// Prints only failures (with the rank), so N ranks do not interleave N full reports.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
    std::fflush(stderr);
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!info.result()->Failed()) return;
    std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(),
                 info.name());
    std::fflush(stderr);
  }

 private:
  int rank_;
};

/// Owns MPI for the test program. MPI starts before InitGoogleTest (the rank decides who
/// prints); TearDown, after the last test, reduces the failure count over all ranks and then
/// finalizes, so the environment is both the first and the last thing that touches MPI.
class MpiEnvironment : public ::testing::Environment {
 public:
  MpiEnvironment(int* argc, char*** argv)
      : runtime_(std::make_unique<wd::comm::MpiRuntime>(argc, argv)) {}
  int rank() const { return runtime_->rank(); }
  int global_failures() const { return global_failures_; }

  void TearDown() override {
    int local = ::testing::UnitTest::GetInstance()->failed_test_count();
    global_failures_ = local;
    if (MPI_Allreduce(&local, &global_failures_, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) !=
        MPI_SUCCESS) {
      global_failures_ = local + 1;  // cannot agree: count it as a failure
    }
    // Rank 0's summary reports the failures of other ranks too (which print their own lines);
    // main's exit code uses the global count on every rank.
    if (runtime_->rank() == 0 && global_failures_ > local) {
      ADD_FAILURE() << (global_failures_ - local)
                    << " test failure(s) on other ranks (their lines start with [rank N])";
    }
    runtime_.reset();
  }

 private:
  std::unique_ptr<wd::comm::MpiRuntime> runtime_;
  int global_failures_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  auto* env = new MpiEnvironment(&argc, &argv);  // GoogleTest takes ownership below
  ::testing::InitGoogleTest(&argc, argv);
  if (env->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(env->rank()));
  }
  ::testing::AddGlobalTestEnvironment(env);
  const int rc = RUN_ALL_TESTS();
  return (rc != 0 || env->global_failures() > 0) ? 1 : 0;
}
