// make_sender / make_receiver on 1 teacher + N students: CPU tensors go over MPI and arrive
// intact; comm.backend nccl for host tensors is refused; the staging of a CUDA student's
// messages; make_stage_streams carries each step down a pipeline of shard stages.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "comm/mpi_runtime.hpp"
#include "comm/process_groups.hpp"
#include "comm/mpi_transport.hpp"
#include "comm/staging_receiver.hpp"
#include "comm/transport_factory.hpp"
#include "mpi_test_util.hpp"

namespace wd::comm::test_transport_factory {
namespace {

using test::world_rank;
using test::world_size;

MessageSpec spec() { return MessageSpec{{{"x", torch::kFloat, {3, 4}}, {"t", torch::kInt, {2}}}}; }

/// The message of `step` for student `slot` of the replica.
TensorDict message(std::int64_t step, int slot = 0) {
  TensorDict d;
  d["x"] = torch::arange(12, torch::kFloat).view({3, 4}) + static_cast<double>(step) * 100 + slot * 1000;
  d["t"] = torch::tensor({static_cast<int>(step), slot}, torch::kInt);
  return d;
}

/// One message per student of a one-teacher layout.
std::vector<TensorDict> per_student(const Layout& layout, std::int64_t step) {
  std::vector<TensorDict> out;
  for (int i = 0; i < layout.students_per_replica(); ++i) out.push_back(message(step, i));
  return out;
}

/// `rank`'s end of the link, made by the factory (no health channel in these tests).
std::unique_ptr<Sender> link_sender(const ProcessGroups& groups, int rank, const CommConfig& config,
                                    std::int64_t steps) {
  return make_sender(link_end(groups, rank, config), spec(), config, 0, steps, c10::Device(c10::kCPU), nullptr);
}

std::unique_ptr<Receiver> link_receiver(const ProcessGroups& groups, int rank, const CommConfig& config,
                                        std::int64_t steps) {
  return make_receiver(link_end(groups, rank, config), spec(), config, 0, steps, c10::Device(c10::kCPU),
                       nullptr);
}

TEST(TransportFactory, CpuDeviceStreamsOverMpi) {
  const int rank = world_rank();
  const auto layout = Layout::make(world_size(), 1);
  ProcessGroups groups(layout, rank);
  CommConfig config;
  config.timeout_s = 30;
  if (layout.role_of(rank) == Role::kTeacher) {
    auto transport = link_sender(groups, rank, config, 3);
    ASSERT_NE(transport, nullptr);
    for (std::int64_t s = 0; s < 3; ++s) transport->send(s, per_student(layout, s));
    transport->flush();
  } else {
    auto transport = link_receiver(groups, rank, config, 3);
    ASSERT_NE(transport, nullptr);
    const int slot = layout.student_slot(rank);
    for (std::int64_t s = 0; s < 3; ++s) {
      const Message& m = transport->recv(s);
      EXPECT_EQ(m.step, s);
      EXPECT_TRUE(torch::equal(m.at("x"), message(s, slot).at("x"))) << "step " << s;
      EXPECT_TRUE(torch::equal(m.at("t"), message(s, slot).at("t"))) << "step " << s;
      transport->release(s);
    }
  }
}

// comm.backend nccl for host tensors is refused on every rank of the link alike (they decide
// from the same gathered devices), naming the rank that holds host tensors.
TEST(TransportFactory, NcclForHostTensorsIsAConfigErrorOnEveryRank) {
  const int rank = world_rank();
  const auto layout = Layout::make(world_size(), 1);
  ProcessGroups groups(layout, rank);
  CommConfig config;
  config.timeout_s = 30;
  config.backend = CommBackend::kNccl;
  try {
    if (layout.role_of(rank) == Role::kTeacher) {
      link_sender(groups, rank, config, 3);
    } else {
      link_receiver(groups, rank, config, 3);
    }
    ADD_FAILURE() << "comm.backend nccl was accepted for host tensors";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("comm.backend(nccl) cannot carry the teacher -> student link of replica 0"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("rank 0 (host on "), std::string::npos) << what;
    EXPECT_NE(what.find("holds host tensors"), std::string::npos) << what;
  }
}

// The student side of an MPI link delivered through StagingReceiver (on the host here: the
// same ring logic a CUDA student runs): every step arrives intact in the staging slots, which
// are reused, and the steps must be released in order.
TEST(TransportFactory, StagingReceiverDeliversEveryStepThroughItsSlots) {
  const int rank = world_rank();
  const auto layout = Layout::make(world_size(), 1);
  ProcessGroups groups(layout, rank);
  CommConfig config;
  config.timeout_s = 30;
  config.prefetch_depth = 2;
  constexpr std::int64_t kSteps = 5;
  const auto end = link_end(groups, rank, config);
  if (layout.role_of(rank) == Role::kTeacher) {
    auto host = make_mpi_sender(end, spec(), config, 0, kSteps, nullptr);
    for (std::int64_t s = 0; s < kSteps; ++s) host->send(s, per_student(layout, s));
    host->flush();
    return;
  }
  const int slot = layout.student_slot(rank);
  StagingReceiver staged(make_mpi_receiver(end, spec(), config, 0, kSteps, nullptr), spec(),
                         c10::Device(c10::kCPU), 2, 0, 30, rank, nullptr);
  std::set<const void*> buffers;
  for (std::int64_t s = 0; s < kSteps; ++s) {
    const Message& m = staged.recv(s);
    EXPECT_EQ(m.step, s);
    EXPECT_TRUE(torch::equal(m.at("x"), message(s, slot).at("x"))) << "step " << s;
    EXPECT_TRUE(torch::equal(m.at("t"), message(s, slot).at("t"))) << "step " << s;
    EXPECT_EQ(&staged.recv(s), &m) << "a second recv of step " << s << " returns the same slot";
    buffers.insert(m.at("x").data_ptr());
    if (s + 1 < kSteps) {
      EXPECT_THROW(staged.release(s + 1), Error) << "release before recv";
    }
    staged.release(s);
  }
  EXPECT_EQ(buffers.size(), 2u) << "two staging slots, allocated once and reused";
}

// teacher.placement shard: world - 1 stages of one replica and one student. Stage 0 makes each
// step's message, every stage adds 1 to `x` and hands it on over its stage links (made by
// make_stage_streams: MPI for host tensors), the last stage streams it to the student.
TEST(TransportFactory, StageLinksCarryEachStepDownThePipeline) {
  const int world = world_size();
  if (world < 3) GTEST_SKIP() << "a pipeline needs 2 stages and a student: run with 3 or more ranks";
  const int rank = world_rank();
  const int stages = world - 1;
  const auto layout = Layout::make(world, stages, stages);
  ProcessGroups groups(layout, rank);
  CommConfig config;
  config.timeout_s = 30;
  config.prefetch_depth = 2;
  constexpr std::int64_t kSteps = 5;
  const c10::Device cpu(c10::kCPU);
  if (layout.role_of(rank) == Role::kStudent) {
    auto link = make_receiver(link_end(groups, rank, config), spec(), config, 0, kSteps, cpu, nullptr);
    for (std::int64_t s = 0; s < kSteps; ++s) {
      const Message& m = link->recv(s);
      EXPECT_TRUE(torch::equal(m.at("x"), message(s).at("x") + stages)) << "step " << s;
      EXPECT_TRUE(torch::equal(m.at("t"), message(s).at("t"))) << "step " << s;
      link->release(s);
    }
    return;
  }
  const int stage = layout.stage_of(rank);
  const bool last = stage + 1 == stages;
  std::unique_ptr<Sender> link;
  if (last) link = make_sender(link_end(groups, rank, config), spec(), config, 0, kSteps, cpu, nullptr);
  auto links = make_stage_streams(groups, rank, spec(), spec(), config, 0, kSteps, cpu, nullptr);
  EXPECT_EQ(links.from_previous != nullptr, stage > 0) << "stage " << stage;
  EXPECT_EQ(links.to_next != nullptr, !last) << "stage " << stage;
  for (std::int64_t s = 0; s < kSteps; ++s) {
    TensorDict m;
    if (stage == 0) {
      m = message(s);
    } else {
      const Message& in = links.from_previous->recv(s);
      for (const auto& [name, t] : in.tensors) m[name] = t.clone();
      links.from_previous->release(s);
    }
    m["x"] = m["x"] + 1;
    (last ? link : links.to_next)->send(s, {m});
  }
  (last ? link : links.to_next)->flush();
}

}  // namespace
}  // namespace wd::comm::test_transport_factory
