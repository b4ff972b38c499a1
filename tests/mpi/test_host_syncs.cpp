// Host synchronisations per training step, counted (issue 23, part 2): the student loop run on
// one rank over seeded batches must make exactly one counted sync per optimizer step (its one
// read of the step's losses), none per micro-batch; and the files on the per-step path must
// not read device values on the host except through the counted helpers.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <algorithm>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "comm/gradient_reducer.hpp"
#include "comm/stream_plan.hpp"
#include "comm/receiver.hpp"
#include "core/errors.hpp"
#include "core/host_sync.hpp"
#include "core/threads.hpp"
#include "model/wan_dit.hpp"
#include "student/student_loop.hpp"
#include "student/student_parts.hpp"

namespace test_host_syncs {
namespace {

using namespace wd;

/// The teacher end of the stream replaced by seeded random batches of the message's shapes (the
/// student loop is what is measured; where its batches come from is not).
class SeededBatches final : public comm::Receiver {
 public:
  explicit SeededBatches(comm::MessageSpec spec) : spec_(std::move(spec)) {}
  const comm::Message& recv(std::int64_t step) override {
    auto gen = at::detail::createCPUGenerator(1000 + static_cast<std::uint64_t>(step));
    comm::TensorDict batch;
    for (const auto& t : spec_.tensors) {
      if (t.name == "t") {
        batch[t.name] = torch::rand(t.shape, gen) * 1000;
      } else if (t.name == "context_lens") {
        batch[t.name] = torch::full(t.shape, spec_context_rows(), torch::kLong);
      } else {
        batch[t.name] = torch::randn(t.shape, gen);
      }
    }
    message_ = {step, batch};
    return message_;
  }
  void release(std::int64_t) override {}
  double wait_seconds() const override { return 0; }

 private:
  std::int64_t spec_context_rows() const {
    for (const auto& t : spec_.tensors) {
      if (t.name == "context") return t.shape[1];
    }
    throw Error("the message has no context");
  }
  comm::MessageSpec spec_;
  comm::Message message_;
};

TEST(HostSyncs, OnePerOptimizerStepNonePerMicroBatch) {
  set_intra_op_threads(1);
  auto tc = WanConfig::preset("tiny");
  student::TrainConfig train;
  train.steps = 4;
  train.grad_accum = 3;
  train.grad_clip = 0.5;  // clipping on: it must not read its norm on the host
  train.log_every = 2;
  comm::StreamPlan plan;
  plan.batch_per_student = 2;
  plan.train_steps = train.steps;
  plan.micro_batches = train.grad_accum;
  plan.latent = {tc.in_dim, 1, 4, 4};
  plan.out_channels = tc.out_dim;
  plan.context_len = 8;
  plan.text_dim = tc.text_dim;
  plan.tokens = 4;
  plan.teacher_dim = tc.dim;

  student::PartsSetup setup;
  setup.teacher_in_channels = tc.in_dim;
  setup.teacher_out_channels = tc.out_dim;
  setup.teacher_dim = tc.dim;
  student::StudentParts parts(WanDiT(tc, WanInit::kRandom, torch::kFloat, 3), setup);
  SeededBatches batches(plan.message_spec());
  comm::MpiGradientReducer reducer(MPI_COMM_WORLD, parts.trainable(), 25'000'000ULL, 60, 0, nullptr);
  student::TrainOptimizer optimizer(parts.trainable(), student::TrainOptimizer::options(train.lr, train));
  student::StudentJob job{parts, batches, reducer, optimizer, plan, train, MPI_COMM_WORLD, 60, 0, {}, true, "",
                          CheckpointPolicy::parse("all")};
  const auto before = host_sync_count();
  const auto stats = student::run_student(job);
  ASSERT_EQ(stats.losses.size(), 4u);
  EXPECT_EQ(host_sync_count() - before, train.steps) << "counted host synchronisations in " << train.steps
                                                     << " steps of " << train.grad_accum << " micro-batches";
}

/// The lines of `path` that read a tensor on the host (`.item`, `.cpu()`, a stream or device
/// synchronise) with neither a counted-sync call nor a `host tensor:` comment within the two
/// lines before, or on, the line.
std::vector<std::string> uncounted_reads(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  const std::regex read(R"(\.item\s*[<(]|\.cpu\(\)|synchronize\s*\(|cudaStreamSynchronize|cudaDeviceSynchronize)");
  const std::regex counted(R"(note_host_sync|read_scalar|host tensor:)");
  std::vector<std::string> found;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto& line = lines[i];
    if (line.compare(std::min(line.size(), line.find_first_not_of(' ')), 2, "//") == 0) continue;  // a comment
    if (!std::regex_search(line, read)) continue;
    bool ok = false;
    for (std::size_t j = i >= 2 ? i - 2 : 0; j <= i; ++j) ok = ok || std::regex_search(lines[j], counted);
    if (!ok) found.push_back(path.filename().string() + ":" + std::to_string(i + 1) + ": " + line);
  }
  return found;
}

TEST(HostSyncs, PerStepFilesReadTheDeviceOnlyThroughTheCounter) {
  const std::filesystem::path src = WD_SOURCE_DIR;
  std::vector<std::string> found;
  for (const char* file : {"src/student/student_loop.cpp", "src/student/train_step.cpp",
                           "src/student/student_parts.cpp", "src/student/checkpointing.cpp",
                           "src/comm/staging_transport.cpp", "src/comm/gradient_reducer.cpp",
                           "src/comm/grad_buckets.cpp", "src/teacher/target_source.cpp", "src/teacher/flow_targets.cpp",
                           "src/teacher/teacher_loop.cpp"}) {
    const auto more = uncounted_reads(src / file);
    found.insert(found.end(), more.begin(), more.end());
  }
  std::ostringstream listing;
  for (const auto& f : found) listing << "\n  " << f;
  EXPECT_TRUE(found.empty()) << "host reads of device values outside wd::read_scalar / note_host_sync "
                                "(mark a read of a host tensor with a `host tensor:` comment):"
                             << listing.str();
}

}  // namespace

}  // namespace test_host_syncs
