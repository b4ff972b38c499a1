// make_transport on 1 teacher + 1 student: CPU tensors go over MPI and arrive intact; a CUDA
// device is refused with a clear ConfigError where the build has no NCCL transport.
#include <gtest/gtest.h>

#include <string>

#include "comm/mpi_runtime.hpp"
#include "comm/process_groups.hpp"
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

TEST(TransportFactory, CudaDeviceNeedsTheNcclBuild) {
  if (nccl_transport_built()) GTEST_SKIP() << "this build has the NCCL transport";
  const int rank = world_rank();
  ProcessGroups groups(Layout::make(2, 1), rank);
  try {
    make_transport(groups, rank, spec(), CommConfig{}, 0, 3, c10::Device(c10::kCUDA, 0));
    ADD_FAILURE() << "a CUDA device was accepted by a build without the NCCL transport";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank " + std::to_string(rank) + " streams tensors on cuda:0"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("this build has no CUDA LibTorch/NCCL"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace wd::comm
