// N-rank tests of NcclComm. Without a GPU only the no-device error is checked (NcclNoGpu.*);
// the NcclGpu.* cases skip, and CTest reports them as Skipped.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_runtime.hpp"
#include "comm/nccl_comm.hpp"
#include "comm/process_groups.hpp"
#include "comm/shard_collectives.hpp"
#include "comm/transport_factory.hpp"
#include "mpi_test_util.hpp"

namespace wd::comm {
namespace {

using test::world_rank;
using test::world_size;

/// Every rank's GPU count is reduced to the minimum, so all ranks skip or run together.
int min_gpus() {
  int mine = visible_cuda_devices(), least = 0;
  MPI_Allreduce(&mine, &least, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return least;
}

/// Device memory of `bytes` owned for one test.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, std::size_t bytes) : bytes_(bytes) {
    CudaDeviceGuard guard(device);
    WD_CHECK_CUDA(cudaMalloc(&data_, bytes));
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return data_; }
  void upload(const std::vector<std::int32_t>& host) {
    WD_CHECK_CUDA(cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice));
  }
  std::vector<std::int32_t> download() const {
    std::vector<std::int32_t> host(bytes_ / sizeof(std::int32_t));
    WD_CHECK_CUDA(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
};

/// Values a step carries: step * 1000 + index, so a message from the wrong step is visible.
std::vector<std::int32_t> pattern(std::int64_t step, std::size_t count) {
  std::vector<std::int32_t> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<std::int32_t>(step * 1000 + i);
  return v;
}

constexpr std::size_t kCount = 4096;  // int32s per message (16 KiB)
constexpr double kTimeout = 60.0;

// ---------------------------------------------------------------------------------------------
// No GPU: the error must say so, on every rank, before anyone waits for a unique id.

TEST(NcclNoGpu, CreationReportsNoDevice) {
  if (visible_cuda_devices() > 0) GTEST_SKIP() << "a GPU is visible; the no-GPU error cannot occur";
  const std::string expected =
      "NCCL transport: no CUDA device visible on rank " + std::to_string(world_rank()) +
      " (cudaGetDeviceCount: ";
  try {
    NcclComm comm(MPI_COMM_WORLD, 0, kTimeout, nullptr);
    ADD_FAILURE() << "NcclComm was created without a GPU";
  } catch (const CudaError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(expected, 0), 0u) << e.what();
  }
  EXPECT_THROW(require_cuda_devices(), CudaError);
}

// ---------------------------------------------------------------------------------------------
// With GPUs. A one-rank communicator (MPI_COMM_SELF) runs on every rank, one GPU per rank where
// there are enough, else rank i on GPU i % count; a communicator over the world needs one GPU
// per rank (NCCL refuses two ranks of one communicator on one GPU).

class NcclGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    gpus_ = min_gpus();
    if (gpus_ == 0) GTEST_SKIP() << "no CUDA device visible";
    device_ = world_rank() % gpus_;
  }
  void need_gpu_per_rank() {
    if (gpus_ < world_size()) {
      GTEST_SKIP() << "needs " << world_size() << " GPUs for " << world_size() << " ranks, have "
                   << gpus_;
    }
  }
  int gpus_ = 0;
  int device_ = 0;
};

TEST_F(NcclGpu, SelfSendRecvInOneGroup) {
  // Streams and buffers before the communicator: it is destroyed first (nccl_comm.hpp).
  CudaStream stream(device_);
  CudaEvent done(device_);
  DeviceBuffer src(device_, kCount * 4), dst(device_, kCount * 4);
  NcclComm comm(MPI_COMM_SELF, device_, kTimeout, nullptr);
  ASSERT_EQ(comm.size(), 1);
  src.upload(pattern(7, kCount));
  dst.upload(std::vector<std::int32_t>(kCount, -1));
  comm.group_start();  // a send to oneself completes only fused with its receive
  comm.send(src.get(), kCount * 4, 0, stream.get());
  comm.recv(dst.get(), kCount * 4, 0, stream.get());
  comm.group_end();
  done.record(stream.get());
  comm.wait(done.get(), WaitInfo{"self send", 7, kCount * 4, {}}, std::chrono::seconds(30));
  EXPECT_EQ(dst.download(), pattern(7, kCount));
}

TEST_F(NcclGpu, BroadcastFromRankZero) {
  need_gpu_per_rank();
  if (IsSkipped()) return;  // GTEST_SKIP in a helper leaves only the helper
  CudaStream stream(device_);
  DeviceBuffer buf(device_, kCount * 4);
  NcclComm comm(MPI_COMM_WORLD, device_, kTimeout, nullptr);
  ASSERT_EQ(comm.size(), world_size());
  buf.upload(world_rank() == 0 ? pattern(3, kCount) : std::vector<std::int32_t>(kCount, 0));
  comm.broadcast(buf.get(), buf.get(), kCount * 4, 0, stream.get());
  comm.wait(stream.get(), WaitInfo{"broadcast", 3, kCount * 4, {}}, std::chrono::seconds(30));
  EXPECT_EQ(buf.download(), pattern(3, kCount));
}

/// Steps go through a ring of two receive slots, several in flight before the first wait; each
/// slot must hold the step it was posted for (NCCL matches a pair's sends in issue order).
TEST_F(NcclGpu, StepsArriveInOrder) {
  const bool pair = world_size() == 2 && gpus_ >= 2;
  CudaStream stream(device_);
  constexpr int kSlots = 2, kSteps = 6;
  std::vector<std::unique_ptr<DeviceBuffer>> slots, sources;
  std::vector<CudaEvent> received;
  for (int i = 0; i < kSlots; ++i) {
    slots.push_back(std::make_unique<DeviceBuffer>(device_, kCount * 4));
    received.emplace_back(device_);
  }
  for (int s = 0; s < kSteps; ++s) {
    sources.push_back(std::make_unique<DeviceBuffer>(device_, kCount * 4));
    sources.back()->upload(pattern(s, kCount));
  }
  NcclComm comm(pair ? MPI_COMM_WORLD : MPI_COMM_SELF, device_, kTimeout, nullptr);
  const int sender = 0, receiver = comm.size() - 1;
  int failures = 0;
  for (int s = 0; s < kSteps; ++s) {
    const int slot = s % kSlots;
    if (s >= kSlots && comm.rank() == receiver) {
      // The slot is reused: read the step that used it before, then post the next receive.
      comm.wait(received[slot].get(), WaitInfo{"recv step", s - kSlots, kCount * 4, {}},
                std::chrono::seconds(30));
      failures += slots[slot]->download() != pattern(s - kSlots, kCount);
    }
    comm.group_start();
    if (comm.rank() == sender) comm.send(sources[s]->get(), kCount * 4, receiver, stream.get());
    if (comm.rank() == receiver) comm.recv(slots[slot]->get(), kCount * 4, sender, stream.get());
    comm.group_end();
    if (comm.rank() == receiver) received[slot].record(stream.get());
  }
  comm.wait(stream.get(), WaitInfo{"drain", kSteps, 0, {}}, std::chrono::seconds(30));
  if (comm.rank() == receiver) {
    for (int s = kSteps - kSlots; s < kSteps; ++s)
      failures += slots[s % kSlots]->download() != pattern(s, kCount);
  }
  EXPECT_EQ(failures, 0);
}

/// A wait that passes its deadline aborts the communicator and names op, step, bytes and rank.
/// A host function holding the stream stands in for a peer that never arrives, so this runs on
/// one rank too. ncclCommAbort frees device memory, and a free waits for all work on the device
/// (NVIDIA/nccl#549, #829): unlike NCCL's own kernels, the host function does not see the abort,
/// so a second thread lets it go after 2 s (without it the abort never returns: seen on an H200).
TEST_F(NcclGpu, TimeoutAbortsTheCommunicator) {
  CudaStream stream(device_);
  CudaEvent after(device_);
  NcclComm comm(MPI_COMM_SELF, device_, kTimeout, nullptr);
  static std::atomic<bool> release{false};
  release = false;
  WD_CHECK_CUDA(cudaLaunchHostFunc(
      stream.get(),
      [](void*) {
        while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      },
      nullptr));
  after.record(stream.get());
  const auto start = std::chrono::steady_clock::now();
  std::thread releaser([] {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    release = true;
  });
  try {
    comm.wait(after.get(), WaitInfo{"recv batch", 42, 1234, {99}}, std::chrono::milliseconds(300));
    ADD_FAILURE() << "the wait returned although the stream was held";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("recv batch of step 42 (1234 bytes) on rank " +
                        std::to_string(world_rank()) + "; waited for rank(s) 99"),
              std::string::npos)
        << what;
    EXPECT_EQ(e.missing(), std::vector<int>{99});
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 0.3);
  EXPECT_LT(waited, 10.0);
  EXPECT_TRUE(comm.aborted());
  EXPECT_THROW(comm.send(nullptr, 4, 0, stream.get()), Error);  // nothing runs after an abort
  releaser.join();
  WD_CHECK_CUDA(cudaStreamSynchronize(stream.get()));
}

/// Two ranks, two GPUs: the receiver's peer never sends; the receiver times out, aborts (its
/// receive kernel returns) and names the sender's world rank.
TEST_F(NcclGpu, MissingPeerTimesOut) {
  if (world_size() != 2) GTEST_SKIP() << "needs exactly 2 ranks";
  need_gpu_per_rank();
  if (IsSkipped()) return;  // GTEST_SKIP in a helper leaves only the helper
  CudaStream stream(device_);
  DeviceBuffer buf(device_, kCount * 4);
  NcclComm comm(MPI_COMM_WORLD, device_, kTimeout, nullptr);
  if (comm.rank() == 1) {
    comm.recv(buf.get(), kCount * 4, 0, stream.get());
    EXPECT_THROW(comm.wait(stream.get(), WaitInfo{"recv batch", 5, kCount * 4, {0}},
                           std::chrono::milliseconds(500)),
                 TimeoutError);
    EXPECT_TRUE(comm.aborted());
  }
  MPI_Barrier(MPI_COMM_WORLD);  // rank 0 stays away until rank 1 has given up
}

/// The NCCL transport end to end on 1 teacher + 1 student, one GPU each: steps through a ring of
/// two slots, in scatter and broadcast mode, arrive with the values sent (dtype converted).
TEST_F(NcclGpu, TransportStreamsStepsInOrder) {
  if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL transport (CPU LibTorch)";
  if (world_size() != 2) GTEST_SKIP() << "needs exactly 2 ranks";
  need_gpu_per_rank();
  if (IsSkipped()) return;  // GTEST_SKIP in a helper leaves only the helper
  const int rank = world_rank();
  const auto layout = Layout::make(2, 1);
  ProcessGroups groups(layout, rank);
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_));
  const MessageSpec spec{{{"x", torch::kFloat, {3, 4}}, {"out", torch::kBFloat16, {5}}}};
  const auto message = [&](std::int64_t step) {
    TensorDict d;
    d["x"] = torch::arange(12, torch::kFloat).view({3, 4}).to(device) + static_cast<double>(step) * 100;
    d["out"] = torch::full({5}, static_cast<double>(step), torch::kDouble).to(device);
    return d;
  };
  for (const auto mode : {CommMode::kScatter, CommMode::kBroadcast}) {
    SCOPED_TRACE(name_of(mode));
    CommConfig config;
    config.mode = mode;
    config.prefetch_depth = 2;
    config.timeout_s = 60;
    const auto end = link_end(groups, rank, config);
    if (layout.role_of(rank) == Role::kTeacher) {
      auto transport = make_sender(end, spec, config, 0, 6, device, nullptr);
      for (std::int64_t s = 0; s < 6; ++s) {
        if (mode == CommMode::kScatter) {
          transport->send(s, {message(s)});
        } else {
          transport->broadcast(s, message(s));
        }
      }
      transport->flush();
    } else {
      auto transport = make_receiver(end, spec, config, 0, 6, device, nullptr);
      for (std::int64_t s = 0; s < 6; ++s) {
        const Message& m = transport->recv(s);
        EXPECT_EQ(m.step, s);
        EXPECT_TRUE(m.at("x").is_cuda());
        EXPECT_TRUE(torch::equal(m.at("x").cpu(), message(s).at("x").cpu())) << "step " << s;
        EXPECT_TRUE(torch::equal(m.at("out").cpu(), message(s).at("out").to(torch::kBFloat16).cpu()))
            << "step " << s;
        transport->release(s);
      }
    }
  }
}

/// ZeRO's collectives over NCCL against their MPI twin on the same values: a reduce-scatter of
/// even parts (ncclReduceScatter) and of uneven ones with an empty part (one ncclReduce a part),
/// an all-gather of even parts in place (ncclAllGather) and of uneven ones (one ncclBroadcast a
/// part). The sums are of small integers, so both backends give the same floats exactly.
TEST_F(NcclGpu, ShardCollectivesMatchTheirMpiTwin) {
  if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL transport (CPU LibTorch)";
  need_gpu_per_rank();
  if (IsSkipped()) return;  // GTEST_SKIP in a helper leaves only the helper
  const int n = world_size(), rank = world_rank();
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_));
  auto nccl = make_nccl_shard_collectives(MPI_COMM_WORLD, device, 60, rank, nullptr);
  auto mpi = make_mpi_shard_collectives(MPI_COMM_WORLD, rank, nullptr);
  ASSERT_STREQ(nccl->backend(), "nccl");
  ASSERT_EQ(nccl->buffer_device(), device);
  const WaitInfo info{"shard collectives test", 0, 0, {}};
  const auto wait = [&](ShardCollectives& c, std::unique_ptr<ShardCollectives::Pending> p) {
    c.wait_all({p.get()}, info, std::chrono::seconds(60));
    EXPECT_TRUE(p->done());
  };
  const auto run_both = [&](const std::vector<int>& counts) {
    SCOPED_TRACE(::testing::PrintToString(counts));
    int total = 0;
    for (const int c : counts) total += c;
    const auto send = torch::arange(total, torch::kFloat) * static_cast<double>(rank + 1);
    const auto mine = counts[static_cast<std::size_t>(rank)];
    auto host = torch::full({std::max(1, mine)}, -1.0f).narrow(0, 0, mine);
    wait(*mpi, mpi->reduce_scatter(send, host, counts));
    auto dev = torch::full({std::max(1, mine)}, -1.0f, device).narrow(0, 0, mine);
    const auto dev_send = send.to(device);
    wait(*nccl, nccl->reduce_scatter(dev_send, dev, counts));
    EXPECT_TRUE(torch::equal(dev.cpu(), host)) << "reduce-scatter";
    std::vector<int> displs;
    for (std::size_t r = 0, at = 0; r < counts.size(); at += static_cast<std::size_t>(counts[r]), ++r) {
      displs.push_back(static_cast<int>(at));
    }
    const auto part = torch::arange(mine, torch::kFloat) + 1000.0 * rank;
    auto gathered_host = torch::full({total}, -1.0f);
    wait(*mpi, mpi->all_gather(part, gathered_host, counts, displs));
    auto gathered_dev = torch::full({total}, -1.0f, device);
    gathered_dev.narrow(0, displs[static_cast<std::size_t>(rank)], mine).copy_(part);  // in place
    wait(*nccl, nccl->all_gather(gathered_dev.narrow(0, displs[static_cast<std::size_t>(rank)], mine), gathered_dev,
                                 counts, displs));
    EXPECT_TRUE(torch::equal(gathered_dev.cpu(), gathered_host)) << "all-gather";
  };
  run_both(std::vector<int>(static_cast<std::size_t>(n), 1000));
  std::vector<int> uneven;
  for (int r = 0; r < n; ++r) uneven.push_back(r == 0 ? 0 : 700 + 13 * r);
  run_both(uneven);
}

}  // namespace
}  // namespace wd::comm
