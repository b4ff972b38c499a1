// Checkpoints and resume, launched for real under mpirun (1 teacher + 2 students): a resumed run
// is bit-identical to a straight one, SIGUSR1 stops with a checkpoint and the requeue code and
// no step is trained twice, a corrupt checkpoint is refused while `--resume auto` falls back,
// and a writer killed in the middle of a save leaves the previous checkpoint to resume from.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "launch_util.hpp"

namespace wd::test_resume {
namespace {

namespace fs = std::filesystem;
using test::count_of;
using test::launch_train;

// teacher.compute fp32: `auto` times bf16 against fp32 matmuls at start-up, and under load the
// choice can differ between the straight and the resumed run (another target, another loss).
constexpr const char* kCommon = " --train.steps 12 --train.log_every 1 --checkpoint.keep 0 --teacher.compute fp32";

std::string bytes_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// step -> loss of every step line in a run's metrics.jsonl from line `from` on (a step seen
/// twice is an error).
std::map<std::int64_t, double> losses_of(const fs::path& run_dir, std::size_t from = 0) {
  std::map<std::int64_t, double> out;
  const auto lines = test::read_metrics(run_dir / "metrics.jsonl");
  for (std::size_t i = from; i < lines.size(); ++i) {
    const auto& m = lines[i];
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
    auto d = test::shared_dir("resume-straight");
    if (fs::exists(d)) return d;  // the setup case's, run in another process
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

// Makes the straight run. First in the program; where CTest runs each case in its own process,
// the fixture every other case requires (tests/launch/CMakeLists.txt).
TEST(Resume, TheStraightRunSavesItsCheckpoints) {
  fs::remove_all(test::shared_dir("resume-straight"));  // an earlier run's
  const auto& a = straight_run();
  EXPECT_EQ(losses_of(a).size(), 12u);
  for (const char* step : {"step-00000006", "step-00000012"}) {
    EXPECT_TRUE(fs::exists(a / "checkpoints" / step / "manifest.json")) << step;
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

TEST(Resume, ASigkillDuringASaveLeavesThePreviousCheckpointAndAutoResumeFinishesExactly) {
  const auto& a = straight_run();
  const auto d = test::fresh_dir("resume-killed-save");
  const auto ckpts = d / "checkpoints";
  // Student 0 (world rank 1) writes the checkpoints, every 3 steps; it dies in the save of step
  // 9, with the files written and the checkpoint not yet sealed. The others find it silent at
  // the deadline (4 s); mpirun's grace lets them explain (see test_failures.cpp).
  const auto killed = launch_train(3, "--run-dir " + d.string() + kCommon +
                                          " --checkpoint.every 3 --comm.timeout_s 4 "
                                          "--inject-fault sigkill@student:0:9:save",
                                   150, 12);
  EXPECT_NE(killed.code, 0) << killed.output;
  EXPECT_LT(killed.seconds, 120) << killed.output;
  EXPECT_EQ(count_of(killed.output, "wan-distill train stopped: diagnosis"), 1) << killed.output;
  EXPECT_EQ(count_of(killed.output, "cause:   rank 1 (student) stopped answering"), 1) << killed.output;
  EXPECT_EQ(count_of(killed.output, "exiting with code 6 ("), 2) << killed.output;

  // What the kill left: a temporary directory, never a checkpoint of step 9; step 6 as it was
  // written (the same state as the straight run's, bit for bit).
  EXPECT_FALSE(fs::exists(ckpts / "step-00000009"));
  int leftovers = 0;
  for (const auto& e : fs::directory_iterator(ckpts)) {
    leftovers += e.path().filename().string().rfind(".tmp-step-00000009-", 0) == 0 ? 1 : 0;
  }
  EXPECT_EQ(leftovers, 1);
  expect_same_training_state(a / "checkpoints" / "step-00000006", ckpts / "step-00000006");
  const auto straight = losses_of(a), first = losses_of(d);
  ASSERT_EQ(first.size(), 9u);  // step 9 was logged before its save began
  for (const auto& [step, loss] : first) EXPECT_EQ(loss, straight.at(step)) << "step " << step;

  const auto lines_before = test::read_metrics(d / "metrics.jsonl").size();
  const auto resumed = launch_train(3, "--run-dir " + d.string() + kCommon + " --checkpoint.every 3 --resume auto");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_EQ(count_of(resumed.output, "left by an interrupted checkpoint save"), 1) << resumed.output;
  EXPECT_EQ(count_of(resumed.output, "resuming from " + (ckpts / "step-00000006").string()), 1) << resumed.output;
  const auto second = losses_of(d, lines_before);
  ASSERT_EQ(second.size(), 6u);
  for (const auto& [step, loss] : second) {
    EXPECT_GT(step, 6);
    EXPECT_EQ(loss, straight.at(step)) << "step " << step;
  }
  expect_same_training_state(a / "checkpoints" / "step-00000012", ckpts / "step-00000012");
}

}  // namespace
}  // namespace wd::test_resume
