// N-rank tests of src/comm: layout, groups, transport (order, timeouts) and gradient all-reduce.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <utility>
#include <thread>

#include "comm/gradient_reducer.hpp"
#include "core/config.hpp"
#include "comm/mpi_runtime.hpp"
#include "comm/process_groups.hpp"
#include "comm/mpi_transport.hpp"
#include "mpi_test_util.hpp"

namespace wd::comm::test_comm_mpi {
namespace {

using test::world_rank;
using test::world_size;

/// Every layout of this world with one or two single-stage teacher replicas
/// (3 ranks: 1T+2S; 4 ranks: 1T+3S and 2T+2S).
std::vector<Layout> layouts() {
  std::vector<Layout> out;
  const int world = world_size();
  for (int t = 1; t <= 2 && t < world; ++t) {
    if ((world - t) % t == 0) out.push_back(Layout::make(world, t));
  }
  return out;
}

std::string describe(const Layout& l) {
  return std::to_string(l.teacher_ranks) + " teacher(s), " + std::to_string(l.student_ranks) +
         " student(s)";
}

std::string thrown_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

// ---------------------------------------------------------------------------------------------
// Layout: pure arithmetic, the same on every rank.

TEST(Layout, OneTeacherTwoStudents) {
  const auto l = Layout::make(3, 1);
  EXPECT_EQ(l.student_ranks, 2);
  EXPECT_EQ(l.replicas, 1);
  EXPECT_EQ(l.role_of(0), Role::kTeacher);
  EXPECT_EQ(l.role_of(1), Role::kStudent);
  EXPECT_EQ(l.role_of(2), Role::kStudent);
  EXPECT_EQ(l.sender_of_replica(0), 0);
  EXPECT_EQ(l.students_of_replica(0), (std::vector<int>{1, 2}));
  EXPECT_EQ(l.student_slot(1), 0);
  EXPECT_EQ(l.student_slot(2), 1);
  EXPECT_EQ(l.replica_of(2), 0);
  const auto topo = l.topology(2, 1, 3);
  EXPECT_EQ(topo.rank, 2);
  EXPECT_EQ(topo.world_size, 3);
  EXPECT_EQ(topo.local_rank, 1);
  EXPECT_EQ(topo.role, Role::kStudent);
}

TEST(Layout, TwoReplicasSplitTheStudents) {
  const auto l = Layout::make(4, 2);
  EXPECT_EQ(l.replicas, 2);
  EXPECT_EQ(l.students_per_replica(), 1);
  EXPECT_EQ(l.sender_of_replica(1), 1);
  EXPECT_EQ(l.replica_of(1), 1);
  EXPECT_EQ(l.replica_of(2), 0);
  EXPECT_EQ(l.replica_of(3), 1);
  EXPECT_EQ(l.students_of_replica(1), (std::vector<int>{3}));
  EXPECT_EQ(l.student_slot(3), 0);
}

TEST(Layout, PipelineStagesFormReplicas) {
  // T = 4 ranks as 2 replicas of 2 stages; S = 6 students, 3 per replica.
  const auto l = Layout::make(10, 4, 2);
  EXPECT_EQ(l.replicas, 2);
  EXPECT_EQ(l.student_ranks, 6);
  EXPECT_EQ(l.sender_of_replica(0), 1);
  EXPECT_EQ(l.sender_of_replica(1), 3);
  EXPECT_EQ(l.replica_of(2), 1);
  EXPECT_EQ(l.replica_of(6), 0);
  EXPECT_EQ(l.replica_of(7), 1);
  EXPECT_EQ(l.students_of_replica(1), (std::vector<int>{7, 8, 9}));
  EXPECT_EQ(l.student_slot(8), 1);
}

/// The ConfigError message of Layout::make(world, teachers, stages).
std::string layout_error(int world, int teachers, int stages = 1) {
  try {
    Layout::make(world, teachers, stages);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

TEST(Layout, InvalidValuesAreAllNamed) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {layout_error(3, 0), "teacher.ranks(0) must be >= 1"},
      {layout_error(3, 3), "world_size(3) - teacher.ranks(3) = 0 students"},
      {layout_error(7, 4),
       "world_size(7) - teacher.ranks(4) = 3 students is not divisible by 4 teacher replicas"},
      {layout_error(5, 3, 2), "teacher.ranks(3) must be divisible by stages(2)"},
      // Several problems at once: each is listed.
      {layout_error(1, 0, 0), "teacher.ranks(0) must be >= 1"},
      {layout_error(1, 0, 0), "stages(0) must be >= 1"},
  };
  for (const auto& [message, part] : cases) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
  EXPECT_THROW(Layout::make(3, 1).role_of(3), Error);
}

TEST(CommConfig, BindsAndValidatesWithValues) {
  CommConfig c;
  OptionTable t("comm");
  c.bind(t);
  parse_options(
      {"--comm.prefetch_depth", "3", "--comm.mode", "broadcast", "--comm.bucket_mb", "0.5"}, t);
  EXPECT_EQ(c.prefetch_depth, 3);
  EXPECT_EQ(c.mode, CommMode::kBroadcast);
  EXPECT_EQ(c.bucket_bytes(), 512u * 1024u);
  ConfigProblems ok;
  c.validate(ok);
  EXPECT_TRUE(ok.empty());

  CommConfig bad;
  bad.prefetch_depth = 0;
  bad.timeout_s = -1;
  bad.bucket_mb = 0;
  ConfigProblems p;
  bad.validate(p);
  const auto msg = thrown_message([&] { p.throw_if_any("config"); });
  for (const char* part : {"comm.prefetch_depth(0) must be >= 1", "comm.timeout_s(-1) must be > 0",
                           "comm.bucket_mb(0)"}) {
    EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg;
  }
  // A name outside comm.mode's table stops the parse, naming every name.
  CommConfig gather;
  OptionTable g("comm");
  gather.bind(g);
  const auto parsed = thrown_message([&] { parse_options({"--comm.mode", "gather"}, g); });
  EXPECT_NE(parsed.find("comm.mode(gather) must be one of scatter, broadcast"), std::string::npos) << parsed;
}

TEST(MessageSpec, BytesAlignEachTensor) {
  MessageSpec spec{
      {{"a", torch::kBFloat16, {3}}, {"b", torch::kFloat, {2, 5}}, {"c", torch::kInt, {0}}}};
  EXPECT_EQ(spec.tensors[0].bytes(), 6u);
  EXPECT_EQ(spec.tensors[1].bytes(), 40u);
  EXPECT_EQ(spec.offsets(), (std::vector<std::uint64_t>{0, 64, 128}));
  EXPECT_EQ(spec.bytes(), 128u);
}

// ---------------------------------------------------------------------------------------------
// Process groups.

TEST(ProcessGroups, SplitsByRoleAndReplica) {
  auto all = layouts();
  if (world_size() == 4) all.push_back(Layout::make(4, 2, 2));  // one replica of two stages
  const int rank = world_rank();
  for (const auto& l : all) {
    SCOPED_TRACE(describe(l) + ", " + std::to_string(l.stages) + " stage(s)");
    ProcessGroups g(l, rank);
    int size = 0, r = 0;
    if (l.role_of(rank) == Role::kTeacher) {
      ASSERT_NE(g.teachers(), MPI_COMM_NULL);
      EXPECT_EQ(g.students(), MPI_COMM_NULL);
      MPI_Comm_size(g.teachers(), &size);
      EXPECT_EQ(size, l.teacher_ranks);
      const int replica = l.replica_of(rank);
      if (rank == l.sender_of_replica(replica)) {
        ASSERT_NE(g.link(), MPI_COMM_NULL);
        MPI_Comm_rank(g.link(), &r);
        EXPECT_EQ(r, 0);
      } else {
        EXPECT_EQ(g.link(), MPI_COMM_NULL);
      }
    } else {
      ASSERT_NE(g.students(), MPI_COMM_NULL);
      EXPECT_EQ(g.teachers(), MPI_COMM_NULL);
      MPI_Comm_size(g.students(), &size);
      EXPECT_EQ(size, l.student_ranks);
      ASSERT_NE(g.link(), MPI_COMM_NULL);
      MPI_Comm_size(g.link(), &size);
      EXPECT_EQ(size, 1 + l.students_per_replica());
      MPI_Comm_rank(g.link(), &r);
      EXPECT_EQ(r, 1 + l.student_slot(rank));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Transport.

MessageSpec batch_spec(std::int64_t rows = 2) {
  return MessageSpec{{{"x_t", torch::kFloat, {rows, 3, 5}},
                      {"t", torch::kFloat, {2}},
                      {"context_lens", torch::kInt, {2}},
                      {"teacher_out", torch::kBFloat16, {2, 3, 5}}}};
}

/// A message whose every value encodes (step, replica, slot), given in other dtypes than the
/// spec's so the transport's conversion is exercised; all values are exact in the spec dtypes.
TensorDict batch(std::int64_t step, int replica, int slot, std::int64_t rows = 2) {
  const double code = static_cast<double>(step * 100 + replica * 10 + slot);
  const double small = static_cast<double>(step * 8 + replica * 4 + slot);  // < 256: exact in bf16
  TensorDict d;
  d["x_t"] = torch::arange(rows * 15, torch::kFloat).view({rows, 3, 5}) + code * 1000;
  d["t"] = torch::full({2}, code, torch::kDouble);
  d["context_lens"] =
      torch::tensor({static_cast<std::int64_t>(code), static_cast<std::int64_t>(code) + 1});
  d["teacher_out"] = torch::remainder(torch::arange(30, torch::kFloat), 4).view({2, 3, 5}) + small;
  return d;
}

void expect_batch(const Message& m, std::int64_t step, int replica, int slot,
                  std::int64_t rows = 2) {
  const auto want = batch(step, replica, slot, rows);
  for (const auto& t : batch_spec(rows).tensors) {
    const auto& got = m.at(t.name);
    EXPECT_EQ(got.scalar_type(), t.dtype) << t.name;
    EXPECT_TRUE(torch::equal(got, want.at(t.name).to(t.dtype)))
        << t.name << " of step " << step << " for replica " << replica << " slot " << slot;
  }
}

/// The MPI ends of `rank`'s teacher -> student link (no health channel in these tests).
std::unique_ptr<Sender> link_sender(const ProcessGroups& g, int rank, const MessageSpec& spec,
                                    const CommConfig& cfg, std::int64_t first, std::int64_t end) {
  return make_mpi_sender(link_end(g, rank, cfg), spec, cfg, first, end, nullptr);
}

std::unique_ptr<Receiver> link_receiver(const ProcessGroups& g, int rank, const MessageSpec& spec,
                                        const CommConfig& cfg, std::int64_t first, std::int64_t end) {
  return make_mpi_receiver(link_end(g, rank, cfg), spec, cfg, first, end, nullptr);
}

std::vector<TensorDict> batches_for(const Layout& l, int rank, std::int64_t step) {
  std::vector<TensorDict> out;
  for (int i = 0; i < l.students_per_replica(); ++i)
    out.push_back(batch(step, l.replica_of(rank), i));
  return out;
}

TEST(Transport, RoundTripInOrderWithPrefetch) {
  const int rank = world_rank();
  const std::int64_t first = 5, end = 25;
  for (const int depth : {1, 2, 4}) {
    for (const auto& l : layouts()) {
      SCOPED_TRACE(describe(l) + ", prefetch_depth " + std::to_string(depth));
      ProcessGroups g(l, rank);
      CommConfig cfg;
      cfg.prefetch_depth = depth;
      cfg.timeout_s = 30;
      if (l.role_of(rank) == Role::kTeacher) {
        auto tr = link_sender(g, rank, batch_spec(), cfg, first, end);
        for (std::int64_t s = first; s < end; ++s) tr->send(s, batches_for(l, rank, s));
        tr->flush();
        EXPECT_GE(tr->wait_seconds(), 0.0);
      } else {
        auto tr = link_receiver(g, rank, batch_spec(), cfg, first, end);
        std::vector<const void*> slot_memory(static_cast<std::size_t>(depth), nullptr);
        for (std::int64_t s = first; s < end; ++s) {
          // A slow student now and then lets the teacher fill the ring and wait for a slot.
          if (s % 7 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
          const Message& m = tr->recv(s);
          EXPECT_EQ(m.step, s);
          expect_batch(m, s, l.replica_of(rank), l.student_slot(rank));
          // The ring is reused: step s lands in the same buffer as step s - depth.
          const void* p = m.at("x_t").data_ptr();
          auto& seen = slot_memory[static_cast<std::size_t>((s - first) % depth)];
          if (seen) {
            EXPECT_EQ(seen, p) << "step " << s << " was not received into its ring slot";
          }
          seen = p;
          tr->release(s);
        }
        EXPECT_GE(tr->wait_seconds(), 0.0);
      }
    }
  }
}

TEST(Transport, BroadcastSendsTheSameBatchToEveryStudent) {
  const int rank = world_rank();
  for (const auto& l : layouts()) {
    SCOPED_TRACE(describe(l));
    ProcessGroups g(l, rank);
    CommConfig cfg;
    cfg.mode = CommMode::kBroadcast;
    cfg.timeout_s = 30;
    if (l.role_of(rank) == Role::kTeacher) {
      auto tr = link_sender(g, rank, batch_spec(), cfg, 0, 10);
      EXPECT_THROW(tr->send(0, batches_for(l, rank, 0)), Error);  // scatter call in broadcast mode
      for (std::int64_t s = 0; s < 10; ++s) tr->broadcast(s, batch(s, l.replica_of(rank), 0));
      tr->flush();
    } else {
      auto tr = link_receiver(g, rank, batch_spec(), cfg, 0, 10);
      for (std::int64_t s = 0; s < 10; ++s) {
        expect_batch(tr->recv(s), s, l.replica_of(rank), /*slot=*/0);
        tr->release(s);
      }
    }
  }
}

TEST(Transport, BadMessagesAreNamed) {
  const int rank = world_rank();
  const auto l = layouts().front();
  ProcessGroups g(l, rank);
  CommConfig cfg;
  cfg.timeout_s = 30;
  if (l.role_of(rank) == Role::kTeacher) {
    // The wrong end is refused before anything is posted: a teacher sends on this link.
    const auto wrong_end = thrown_message([&] { link_receiver(g, rank, batch_spec(), cfg, 0, 1); });
    EXPECT_NE(wrong_end.find("sends on the teacher -> student link of replica 0, and a receiver was asked for"),
              std::string::npos)
        << wrong_end;
    auto tr = link_sender(g, rank, batch_spec(), cfg, 0, 1);
    auto wrong = batches_for(l, rank, 0);
    wrong[0]["x_t"] = torch::zeros({2, 3, 4});
    const auto shape = thrown_message([&] { tr->send(0, wrong); });
    EXPECT_NE(
        shape.find("tensor 'x_t' for student 0 of step 0: expected shape [2,3,5], got [2,3,4]"),
        std::string::npos)
        << shape;
    auto missing = batches_for(l, rank, 0);
    missing[0].erase("t");
    EXPECT_NE(thrown_message([&] { tr->send(0, missing); }).find("lacks tensor 't'"),
              std::string::npos);
    EXPECT_THROW(tr->send(1, batches_for(l, rank, 1)), Error);  // out of order
    tr->send(0, batches_for(l, rank, 0));                       // a failed send left no trace
    tr->flush();
  } else {
    auto tr = link_receiver(g, rank, batch_spec(), cfg, 0, 1);
    const Message& m = tr->recv(0);
    expect_batch(m, 0, l.replica_of(rank), l.student_slot(rank));
    const auto absent = thrown_message([&] { m.at("noise"); });
    EXPECT_NE(absent.find("no tensor 'noise'"), std::string::npos) << absent;
    EXPECT_NE(absent.find("context_lens, t, teacher_out, x_t"), std::string::npos) << absent;
    EXPECT_THROW(tr->release(1), Error);  // not the oldest held step
    tr->release(0);
  }
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  return out;
}

/// Runs `f`, retrying after a TimeoutError: a timeout leaves the transport as it was, so the
/// recovery phases below do not depend on the 1 s deadline being enough on a loaded machine.
void retry_on_timeout(const std::function<void()>& f) {
  for (int attempt = 1;; ++attempt) {
    try {
      f();
      return;
    } catch (const TimeoutError&) {
      if (attempt == 20) throw;
    }
  }
}

TEST(Transport, ReceiveTimeoutNamesOpStepAndTeacherThenRecovers) {
  const int rank = world_rank();
  for (const auto& l : layouts()) {
    SCOPED_TRACE(describe(l));
    ProcessGroups g(l, rank);
    CommConfig cfg;
    cfg.timeout_s = 1;
    if (l.role_of(rank) == Role::kTeacher) {
      auto tr = link_sender(g, rank, batch_spec(), cfg, 3, 5);
      MPI_Barrier(MPI_COMM_WORLD);  // the students have timed out: now send, late
      for (std::int64_t s = 3; s < 5; ++s)
        retry_on_timeout([&] { tr->send(s, batches_for(l, rank, s)); });
      retry_on_timeout([&] { tr->flush(); });
    } else {
      auto tr = link_receiver(g, rank, batch_spec(), cfg, 3, 5);
      const int teacher = l.sender_of_replica(l.replica_of(rank));
      const auto start = std::chrono::steady_clock::now();
      std::string msg;
      try {
        tr->recv(3);
        ADD_FAILURE() << "recv returned although the teacher never sent";
      } catch (const TimeoutError& e) {
        msg = e.what();
      }
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_GE(waited, 0.9);
      EXPECT_LT(waited, 10.0);
      EXPECT_NE(msg.find("timeout after 1s waiting for recv batch of step 3"), std::string::npos)
          << msg;
      EXPECT_NE(msg.find("on rank " + std::to_string(rank)), std::string::npos) << msg;
      EXPECT_NE(msg.find("waited for rank(s) " + std::to_string(teacher)), std::string::npos)
          << msg;
      EXPECT_GE(tr->wait_seconds(), 0.9);
      MPI_Barrier(MPI_COMM_WORLD);
      // The receive was left posted, so the late batch still arrives in its slot.
      for (std::int64_t s = 3; s < 5; ++s) {
        retry_on_timeout([&] { tr->recv(s); });
        expect_batch(tr->recv(s), s, l.replica_of(rank), l.student_slot(rank));
        tr->release(s);
      }
    }
  }
}

TEST(Transport, SendTimeoutNamesMissingStudentsThenRecovers) {
  const int rank = world_rank();
  // 1 MiB per student: far above the eager limit, so a send completes only once it is received.
  const std::int64_t rows = 1 << 14;
  for (const auto& l : layouts()) {
    SCOPED_TRACE(describe(l));
    ProcessGroups g(l, rank);
    CommConfig cfg;
    cfg.timeout_s = 1;
    cfg.prefetch_depth = 1;
    const auto spec = batch_spec(rows);
    if (l.role_of(rank) == Role::kTeacher) {
      auto tr = link_sender(g, rank, spec, cfg, 0, 2);
      const int replica = l.replica_of(rank);
      std::vector<TensorDict> step0, step1;
      for (int i = 0; i < l.students_per_replica(); ++i) {
        step0.push_back(batch(0, replica, i, rows));
        step1.push_back(batch(1, replica, i, rows));
      }
      tr->send(0, step0);
      std::string msg;
      try {
        tr->send(1, step1);  // the only slot still holds step 0, which nobody receives
        ADD_FAILURE() << "send of step 1 returned although no student received step 0";
      } catch (const TimeoutError& e) {
        msg = e.what();
      }
      EXPECT_NE(msg.find("waiting for send batch of step 0"), std::string::npos) << msg;
      EXPECT_NE(msg.find("waited for rank(s) " + ranks_text(l.students_of_replica(replica))),
                std::string::npos)
          << msg;
      MPI_Barrier(MPI_COMM_WORLD);
      // The students now receive, so step 0's slot frees up.
      retry_on_timeout([&] { tr->send(1, step1); });
      retry_on_timeout([&] { tr->flush(); });
    } else {
      MPI_Barrier(MPI_COMM_WORLD);
      auto tr = link_receiver(g, rank, spec, cfg, 0, 2);
      for (std::int64_t s = 0; s < 2; ++s) {
        retry_on_timeout([&] { tr->recv(s); });
        expect_batch(tr->recv(s), s, l.replica_of(rank), l.student_slot(rank), rows);
        tr->release(s);
      }
    }
  }
}

TEST(Transport, StudentCancelsOutstandingReceivesOnDestruction) {
  const int rank = world_rank();
  for (const auto& l : layouts()) {
    SCOPED_TRACE(describe(l));
    ProcessGroups g(l, rank);
    CommConfig cfg;
    cfg.timeout_s = 30;
    cfg.prefetch_depth = 3;
    // Students post three receives and go away; the teacher never sends.
    if (l.role_of(rank) == Role::kStudent) link_receiver(g, rank, batch_spec(), cfg, 0, 10);
    MPI_Barrier(MPI_COMM_WORLD);
    // The cancelled receives must not swallow a later stream on the same link.
    if (l.role_of(rank) == Role::kTeacher) {
      auto tr = link_sender(g, rank, batch_spec(), cfg, 0, 2);
      for (std::int64_t s = 0; s < 2; ++s) tr->send(s, batches_for(l, rank, s));
      tr->flush();
    } else {
      auto tr = link_receiver(g, rank, batch_spec(), cfg, 0, 2);
      for (std::int64_t s = 0; s < 2; ++s) {
        expect_batch(tr->recv(s), s, l.replica_of(rank), l.student_slot(rank));
        tr->release(s);
      }
    }
  }
}

TEST(Transport, TeacherDestructorDoesNotWaitForAbsentStudents) {
  const int rank = world_rank();
  const auto l = layouts().front();
  ProcessGroups g(l, rank);
  CommConfig cfg;
  cfg.timeout_s = 30;
  if (l.role_of(rank) == Role::kTeacher) {
    const std::int64_t rows = 1 << 14;  // rendezvous-sized: the sends cannot complete unreceived
    const auto start = std::chrono::steady_clock::now();
    {
      auto tr = link_sender(g, rank, batch_spec(rows), cfg, 0, 1);
      std::vector<TensorDict> step0;
      for (int i = 0; i < l.students_per_replica(); ++i) step0.push_back(batch(0, 0, i, rows));
      tr->send(0, step0);
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The send fault hook (--inject-fault ...:send) runs inside every send once the step's sends are
// started, so a failure there leaves that step on its way to the students.
TEST(Transport, SendFaultHookRunsOnceTheStepsSendsAreStarted) {
  const int rank = world_rank();
  for (const auto& l : layouts()) {
    SCOPED_TRACE(describe(l));
    ProcessGroups g(l, rank);
    CommConfig cfg;
    cfg.timeout_s = 30;
    if (l.role_of(rank) == Role::kTeacher) {
      auto tr = link_sender(g, rank, batch_spec(), cfg, 0, 4);
      std::vector<std::int64_t> hooked;
      tr->set_send_fault_hook([&](std::int64_t step) {
        hooked.push_back(step);
        if (step == 2) throw Error("fault inside the send of step 2");
      });
      for (std::int64_t s = 0; s < 4; ++s) {
        if (s == 2) {
          EXPECT_THROW(tr->send(s, batches_for(l, rank, s)), Error);
        } else {
          tr->send(s, batches_for(l, rank, s));
        }
      }
      tr->flush();
      EXPECT_EQ(hooked, (std::vector<std::int64_t>{0, 1, 2, 3}));
    } else {
      auto tr = link_receiver(g, rank, batch_spec(), cfg, 0, 4);
      for (std::int64_t s = 0; s < 4; ++s) {
        expect_batch(tr->recv(s), s, l.replica_of(rank), l.student_slot(rank));
        tr->release(s);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Gradient all-reduce.

torch::nn::Sequential tiny_model() {
  torch::manual_seed(7);  // the same initial weights on every rank and in the reference
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
}

/// The union of every student's batch (kPerStudent samples each) and the reference model's
/// gradients over it: what one process would compute.
struct UnionBatch {
  torch::Tensor x, y;
  torch::nn::Sequential reference;
};
constexpr std::int64_t kPerStudent = 4;
UnionBatch union_batch(int students) {
  torch::manual_seed(11);
  UnionBatch u{torch::randn({students * kPerStudent, 6}), torch::randn({students * kPerStudent, 3}), tiny_model()};
  torch::mse_loss(u.reference->forward(u.x), u.y).backward();
  return u;
}

TEST(GradientReducer, BucketedAverageEqualsOneProcessOverTheUnion) {
  const int rank = world_rank();
  for (const auto& l : layouts()) {
    SCOPED_TRACE(describe(l));
    ProcessGroups g(l, rank);
    if (l.role_of(rank) == Role::kTeacher) continue;
    const auto [x, y, reference] = union_batch(l.student_ranks);

    auto model = tiny_model();
    auto unused = torch::ones({4}, torch::requires_grad());  // never in the graph: no .grad
    auto params = model->parameters();
    params.push_back(unused);
    // 192-byte weight alone; bias + 96-byte weight fill 128 bytes; last bias + unused: 3 buckets.
    MpiGradientReducer reducer(g.students(), params, /*bucket_bytes=*/128, /*timeout_s=*/30, rank, nullptr);
    EXPECT_EQ(reducer.bucket_count(), 3u);

    const std::int64_t me = rank - l.teacher_ranks;
    const auto xs = x.narrow(0, me * kPerStudent, kPerStudent);
    const auto ys = y.narrow(0, me * kPerStudent, kPerStudent);
    for (const double scale : {1.0, 2.0}) {  // twice: the buckets are reused
      SCOPED_TRACE("loss scale " + std::to_string(scale));
      model->zero_grad();
      (torch::mse_loss(model->forward(xs), ys) * scale).backward();
      reducer.average(static_cast<std::int64_t>(scale));
      const auto want = reference->parameters();
      const auto got = model->parameters();
      ASSERT_EQ(want.size(), got.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(got[i].grad().defined());
        const double diff = (got[i].grad() - want[i].grad() * scale).abs().max().item<double>();
        EXPECT_LE(diff, 1e-6) << "parameter " << i;
      }
      ASSERT_TRUE(unused.grad().defined());
      EXPECT_EQ(unused.grad().abs().sum().item<double>(), 0.0);
    }
    EXPECT_GE(reducer.wait_seconds(), 0.0);
  }
}

// The gradients exist once: every .grad is a view into its bucket (bound at construction, the
// values a grad already had kept), the backward accumulates into it in place, and the average
// leaves it there (same storage), equal to one process over the union of the batches.
TEST(GradientReducer, GradientsAreViewsIntoTheBucketsAndStayThere) {
  const int rank = world_rank();
  const auto l = Layout::make(test::world_size(), 1);
  ProcessGroups g(l, rank);
  if (l.role_of(rank) == Role::kTeacher) return;
  const auto [x, y, reference] = union_batch(l.student_ranks);

  auto model = tiny_model();
  auto params = model->parameters();
  params[0].mutable_grad() = torch::full_like(params[0], 0.25);  // a grad from before: kept
  MpiGradientReducer reducer(g.students(), params, /*bucket_bytes=*/1 << 20, /*timeout_s=*/30, rank, nullptr);
  ASSERT_EQ(reducer.bucket_count(), 1u);
  EXPECT_EQ(params[0].grad().min().item<float>(), 0.25f);
  std::vector<const void*> storage;
  const auto* base = static_cast<const char*>(params[0].grad().data_ptr());
  std::int64_t offset = 0;
  for (const auto& p : params) {
    ASSERT_TRUE(p.grad().defined());
    // One flat buffer in parameter order: each grad starts where the previous one ends.
    EXPECT_EQ(static_cast<const char*>(p.grad().data_ptr()), base + offset * 4);
    offset += p.numel();
    storage.push_back(p.grad().data_ptr());
  }
  const std::int64_t me = rank - l.teacher_ranks;
  for (int step = 0; step < 2; ++step) {
    std::vector<torch::Tensor> grads;
    for (auto& p : params) grads.push_back(p.mutable_grad());
    for (auto& grad : grads) grad.zero_();  // as StudentParts::zero_grad: in place
    torch::mse_loss(model->forward(x.narrow(0, me * kPerStudent, kPerStudent)),
                    y.narrow(0, me * kPerStudent, kPerStudent))
        .backward();
    reducer.average(step);
    const auto want = reference->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(params[i].grad().data_ptr(), storage[i]) << "parameter " << i << " lost its view";
      EXPECT_LE((params[i].grad() - want[i].grad()).abs().max().item<double>(), 1e-6) << "parameter " << i;
    }
  }
}

// The all-reduce fault hook (--inject-fault ...:allreduce) runs inside every average, with the
// step it was given, and leaves the average as it was.
TEST(GradientReducer, FaultHookRunsInsideEveryAverageWithItsStep) {
  const int rank = world_rank();
  const auto l = Layout::make(test::world_size(), 1);
  ProcessGroups g(l, rank);
  if (l.role_of(rank) == Role::kTeacher) return;
  auto model = tiny_model();
  MpiGradientReducer reducer(g.students(), model->parameters(), 1 << 20, 30, rank, nullptr);
  std::vector<std::int64_t> hooked;
  reducer.set_fault_hook([&](std::int64_t step) { hooked.push_back(step); });
  for (const std::int64_t step : {4, 5}) {
    model->zero_grad();
    // Every student's gradient is its rank: the average is the mean rank.
    for (auto& p : model->parameters()) p.mutable_grad() = torch::full_like(p, static_cast<double>(rank));
    reducer.average(step);
    const double mean = (l.teacher_ranks + l.world_size - 1) / 2.0;
    for (const auto& p : model->parameters()) EXPECT_TRUE(p.grad().eq(mean).all().item<bool>()) << p.grad();
  }
  EXPECT_EQ(hooked, (std::vector<std::int64_t>{4, 5}));
}

// make_gradient_reducer: host parameters get the MPI reducer under auto; nccl is refused on
// every student alike, naming a rank that holds host tensors.
TEST(GradientReducer, FactoryChoosesMpiForHostParametersAndRefusesNccl) {
  const int rank = world_rank();
  const auto l = Layout::make(test::world_size(), 1);
  ProcessGroups g(l, rank);
  if (l.role_of(rank) == Role::kTeacher) return;
  auto model = tiny_model();
  auto reducer = make_gradient_reducer(g.students(), model->parameters(), 1 << 20, 30, rank,
                                       c10::Device(c10::kCPU), CommBackend::kAuto, nullptr);
  EXPECT_STREQ(reducer->backend(), "mpi");
  try {
    make_gradient_reducer(g.students(), model->parameters(), 1 << 20, 30, rank,
                          c10::Device(c10::kCPU), CommBackend::kNccl, nullptr);
    ADD_FAILURE() << "comm.backend nccl was accepted for host parameters";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("comm.backend(nccl) cannot carry the gradient all-reduce"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("holds host tensors"), std::string::npos) << e.what();
  }
}

// A group of one student: make_gradient_reducer gives the local reducer (no communicator, no
// copies) whatever comm.backend says, and it leaves every gradient bit for bit as it was (the
// average over one), equal to what the MPI reducer over a 1-rank group computes; a missing
// grad becomes zeros as with the others, and the fault hook still runs.
TEST(GradientReducer, AGroupOfOneMovesNothingAndLeavesGradientsBitIdentical) {
  const int rank = world_rank();
  torch::manual_seed(100 + rank);
  auto model = tiny_model();
  auto unused = torch::ones({4}, torch::requires_grad());
  auto params = model->parameters();
  params.push_back(unused);
  const auto x = torch::randn({5, 6});
  torch::mse_loss(model->forward(x), torch::randn({5, 3})).backward();
  std::vector<torch::Tensor> before;
  for (const auto& p : model->parameters()) before.push_back(p.grad().clone());

  for (const auto backend : {CommBackend::kAuto, CommBackend::kMpi, CommBackend::kNccl}) {
    SCOPED_TRACE(name_of(backend));
    auto local = make_gradient_reducer(MPI_COMM_SELF, params, 1 << 20, 30, rank, c10::Device(c10::kCPU),
                                       backend, nullptr);
    EXPECT_STREQ(local->backend(), "none");
    EXPECT_EQ(local->bucket_count(), 0u);
    std::vector<std::int64_t> hooked;
    local->set_fault_hook([&](std::int64_t step) { hooked.push_back(step); });
    local->average(7);
    EXPECT_EQ(hooked, (std::vector<std::int64_t>{7}));
    EXPECT_EQ(local->wait_seconds(), 0.0);
    const auto got = model->parameters();
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(torch::equal(got[i].grad(), before[i])) << "parameter " << i;
    }
    ASSERT_TRUE(unused.grad().defined());
    EXPECT_EQ(unused.grad().abs().sum().item<double>(), 0.0);
    unused.mutable_grad() = torch::Tensor();
  }

  // The MPI reducer over one rank: the same bits (pack to fp32, divide by 1, copy back).
  MpiGradientReducer mpi(MPI_COMM_SELF, params, 1 << 20, 30, rank, nullptr);
  mpi.average(0);
  const auto got = model->parameters();
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::equal(got[i].grad(), before[i])) << "parameter " << i;
  }
}

}  // namespace
}  // namespace wd::comm::test_comm_mpi
