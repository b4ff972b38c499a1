// Checkpoints and resume, launched for real under mpirun (1 teacher + 2 students): a resumed run
// is bit-identical to a straight one, SIGUSR1 stops with a checkpoint and the requeue code and
// no step is trained twice, and a corrupt checkpoint is refused while `--resume auto` falls back.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "launch_util.hpp"

namespace wd {
namespace {

namespace fs = std::filesystem;
using test::count_of;
using test::launch_train;

constexpr const char* kCommon = " --train.steps 12 --train.log_every 1 --checkpoint.keep 0";

std::string bytes_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// step -> loss of every step line in a run's metrics.jsonl (a step seen twice is an error).
std::map<std::int64_t, double> losses_of(const fs::path& run_dir) {
  std::map<std::int64_t, double> out;
  for (const auto& m : test::read_metrics(run_dir / "metrics.jsonl")) {
    if (!m.contains("loss")) continue;
    const auto step = m["step"].get<std::int64_t>();
    EXPECT_EQ(out.count(step), 0u) << "step " << step << " was trained twice in " << run_dir;
    out[step] = m["loss"].get<double>();
  }
  return out;
}

/// The straight 12-step run with checkpoints at 6 and 12, shared by the tests.
const fs::path& straight_run() {
  static const fs::path dir = [] {
    auto d = test::fresh_dir("resume-straight");
    const auto r = launch_train(3, "--run-dir " + d.string() + kCommon + " --checkpoint.every 6");
    EXPECT_EQ(r.code, 0) << r.output;
    return d;
  }();
  return dir;
}

void expect_same_training_state(const fs::path& a, const fs::path& b) {
  for (const char* file : {"trainable.safetensors", "optimizer.safetensors"}) {
    ASSERT_TRUE(fs::exists(a / file) && fs::exists(b / file)) << a << " " << b;
    EXPECT_TRUE(bytes_of(a / file) == bytes_of(b / file)) << file << " differs between " << a << " and " << b;
  }
}

TEST(Resume, FromAMidRunCheckpointIsBitIdenticalToTheStraightRun) {
  const auto& a = straight_run();
  const auto b = test::fresh_dir("resume-mid");
  const auto r = launch_train(3, "--run-dir " + b.string() + kCommon + " --checkpoint.every 6 --resume " +
                                     (a / "checkpoints" / "step-00000006").string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count_of(r.output, "resuming from"), 1) << r.output;
  const auto straight = losses_of(a), resumed = losses_of(b);
  ASSERT_EQ(straight.size(), 12u);
  ASSERT_EQ(resumed.size(), 6u);
  for (const auto& [step, loss] : resumed) EXPECT_EQ(loss, straight.at(step)) << "step " << step;
  expect_same_training_state(a / "checkpoints" / "step-00000012", b / "checkpoints" / "step-00000012");
}

TEST(Resume, Sigusr1StopsWithACheckpointAndTheRequeueCodeAndAutoResumeFinishesExactly) {
  const auto& a = straight_run();
  const auto c = test::fresh_dir("resume-requeue");
  // SIGUSR1 reaches one student only; it is forwarded, and all stop after the same step.
  const auto first = launch_train(3, "--run-dir " + c.string() + kCommon + " --inject-fault sigusr1@student:1:6");
  ASSERT_EQ(first.code, 75) << first.output;
  EXPECT_TRUE(fs::exists(c / "checkpoints" / "step-00000006" / "manifest.json")) << first.output;
  EXPECT_EQ(losses_of(c).size(), 6u);
  const auto second = launch_train(3, "--run-dir " + c.string() + kCommon + " --resume auto");
  ASSERT_EQ(second.code, 0) << second.output;
  const auto all = losses_of(c), straight = losses_of(a);  // no step twice (checked inside)
  ASSERT_EQ(all.size(), 12u);
  for (const auto& [step, loss] : all) EXPECT_EQ(loss, straight.at(step)) << "step " << step;
  expect_same_training_state(a / "checkpoints" / "step-00000012", c / "checkpoints" / "step-00000012");
}

TEST(Resume, ACorruptCheckpointIsRefusedAndAutoFallsBackToThePreviousGoodOne) {
  const auto& a = straight_run();
  const auto d = test::fresh_dir("resume-corrupt");
  fs::create_directories(d);
  fs::copy(a / "checkpoints", d / "checkpoints", fs::copy_options::recursive);
  const auto bad = d / "checkpoints" / "step-00000012" / "trainable.safetensors";
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x5a');
  }
  const auto refused = launch_train(3, "--run-dir " + d.string() + " --train.steps 14 --resume " +
                                           bad.parent_path().string());
  EXPECT_EQ(refused.code, 3) << refused.output;
  EXPECT_GE(count_of(refused.output, "trainable.safetensors: checksum mismatch"), 1) << refused.output;
  const auto fallback = launch_train(3, "--run-dir " + d.string() + " --train.steps 14 --resume auto");
  ASSERT_EQ(fallback.code, 0) << fallback.output;
  EXPECT_GE(count_of(fallback.output, "checksum mismatch"), 1) << fallback.output;
  EXPECT_EQ(count_of(fallback.output, "resuming from " + (d / "checkpoints" / "step-00000006").string()), 1)
      << fallback.output;
}

}  // namespace
}  // namespace wd
