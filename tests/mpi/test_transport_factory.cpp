// make_transport on 1 teacher + 1 student: CPU tensors go over MPI and arrive intact;
// comm.backend nccl for host tensors is refused; the staging of a CUDA student's messages.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "comm/mpi_runtime.hpp"
#include "comm/process_groups.hpp"
#include "comm/staging_transport.hpp"
#include "comm/transport_factory.hpp"
#include "mpi_test_util.hpp"

namespace wd::comm {
namespace {

using test::world_rank;

MessageSpec spec() { return MessageSpec{{{"x", torch::kFloat, {3, 4}}, {"t", torch::kInt, {2}}}}; }

TensorDict message(std::int64_t step) {
  TensorDict d;
  d["x"] = torch::arange(12, torch::kFloat).view({3, 4}) + static_cast<double>(step) * 100;
  d["t"] = torch::tensor({static_cast<int>(step), static_cast<int>(step) + 1}, torch::kInt);
  return d;
}

TEST(TransportFactory, CpuDeviceStreamsOverMpi) {
  const int rank = world_rank();
  const auto layout = Layout::make(2, 1);
  ProcessGroups groups(layout, rank);
  CommConfig config;
  config.timeout_s = 30;
  auto transport = make_transport(groups, rank, spec(), config, 0, 3, c10::Device(c10::kCPU));
  ASSERT_NE(transport, nullptr);
  if (layout.role_of(rank) == Role::kTeacher) {
    for (std::int64_t s = 0; s < 3; ++s) transport->send(s, {message(s)});
    transport->flush();
  } else {
    for (std::int64_t s = 0; s < 3; ++s) {
      const Message& m = transport->recv(s);
      EXPECT_EQ(m.step, s);
      EXPECT_TRUE(torch::equal(m.at("x"), message(s).at("x"))) << "step " << s;
      EXPECT_TRUE(torch::equal(m.at("t"), message(s).at("t"))) << "step " << s;
      transport->release(s);
    }
  }
}

// comm.backend nccl for host tensors is refused on every rank of the link alike (they decide
// from the same gathered devices), naming the rank that holds host tensors.
TEST(TransportFactory, NcclForHostTensorsIsAConfigErrorOnEveryRank) {
  const int rank = world_rank();
  ProcessGroups groups(Layout::make(2, 1), rank);
  CommConfig config;
  config.timeout_s = 30;
  config.backend = "nccl";
  try {
    make_transport(groups, rank, spec(), config, 0, 3, c10::Device(c10::kCPU));
    ADD_FAILURE() << "comm.backend nccl was accepted for host tensors";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("comm.backend(nccl) cannot carry the teacher -> student link of rank 0"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("rank 0 (host on "), std::string::npos) << what;
    EXPECT_NE(what.find("holds host tensors"), std::string::npos) << what;
  }
}

// The student side of an MPI link delivered through StagingTransport (on the host here: the
// same ring logic a CUDA student runs): every step arrives intact in the staging slots, which
// are reused, and the steps must be released in order.
TEST(TransportFactory, StagingTransportDeliversEveryStepThroughItsSlots) {
  const int rank = world_rank();
  const auto layout = Layout::make(2, 1);
  ProcessGroups groups(layout, rank);
  CommConfig config;
  config.timeout_s = 30;
  config.prefetch_depth = 2;
  constexpr std::int64_t kSteps = 5;
  auto host = make_mpi_transport(groups, rank, spec(), config, 0, kSteps);
  if (layout.role_of(rank) == Role::kTeacher) {
    for (std::int64_t s = 0; s < kSteps; ++s) host->send(s, {message(s)});
    host->flush();
    return;
  }
  StagingTransport staged(std::move(host), spec(), c10::Device(c10::kCPU), 2, 0);
  std::set<const void*> buffers;
  for (std::int64_t s = 0; s < kSteps; ++s) {
    const Message& m = staged.recv(s);
    EXPECT_EQ(m.step, s);
    EXPECT_TRUE(torch::equal(m.at("x"), message(s).at("x"))) << "step " << s;
    EXPECT_TRUE(torch::equal(m.at("t"), message(s).at("t"))) << "step " << s;
    EXPECT_EQ(&staged.recv(s), &m) << "a second recv of step " << s << " returns the same slot";
    buffers.insert(m.at("x").data_ptr());
    if (s + 1 < kSteps) {
      EXPECT_THROW(staged.release(s + 1), Error) << "release before recv";
    }
    staged.release(s);
  }
  EXPECT_EQ(buffers.size(), 2u) << "two staging slots, allocated once and reused";
}

}  // namespace
}  // namespace wd::comm
