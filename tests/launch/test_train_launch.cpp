// `wan-distill train` launched for real under mpirun (3 ranks): the golden loss curve, the
// saved student, steady memory over 200 steps, and one agreed config error through the launcher
// (every other config error is the job library's, tested in one process: tests/unit/test_job.cpp).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "launch_util.hpp"
#include "core/torch_compat.hpp"
#include "model/wan_checkpoint.hpp"

namespace wd::test_train_launch {
namespace {

namespace fs = std::filesystem;
const std::string kFixtures = WD_FIXTURES;
// One golden curve per LibTorch version: each brings its own kernels (and BLAS: OpenBLAS for
// Debian's 1.13, MKL in the pip wheels), so the curves agree across versions only to ~1e-4.
const std::string kCurve = kFixtures + "/loss-curves/tiny-3rank-20steps-torch" + compat::torch_version() + ".json";

/// This host's CPU as /proc/cpuinfo names it, and whether it has AVX-512 and AMX (what moves a
/// bf16 matmul's code path; the golden curve's fp32 teacher should not care).
std::string cpu_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU", flags;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0 && model == "unknown CPU") model = line.substr(line.find(':') + 2);
    if (line.rfind("flags", 0) == 0 && flags.empty()) flags = " " + line + " ";
  }
  const auto has = [&](const char* f) { return flags.find(std::string(" ") + f + " ") != std::string::npos; };
  return model + (has("avx512f") ? ", AVX-512" : ", no AVX-512") + (has("amx_bf16") ? ", AMX" : "");
}

/// Runs `wan-distill train` on `ranks` ranks (mpirun's --timeout bounds a hang).
test::LaunchResult train(int ranks, const std::string& args) { return test::launch_train(ranks, args); }

/// One run dir shared by the tests (the builtin teacher and data are generated once).
const fs::path& run_dir() {
  static const fs::path dir = test::fresh_dir("train");
  return dir;
}

/// The held-out relative MSE before and after training, from the last evaluation line.
std::pair<double, double> eval_before_after(const fs::path& dir) {
  std::pair<double, double> r{-1, -1};
  for (const auto& m : test::read_metrics(dir / "metrics.jsonl")) {
    if (m.contains("rel_mse_before")) r = {m["rel_mse_before"].get<double>(), m["rel_mse"].get<double>()};
  }
  return r;
}

TEST(Train, TinyRunReproducesTheGoldenLossCurveAndSavesTheStudent) {
  const auto dir = run_dir() / "golden";
  const auto r = train(3, "--run-dir " + dir.string() +
                              " --data.path builtin:tiny --train.steps 20 --train.log_every 1 --train.seed 7"
                              // the curve's teacher computes in fp32 (pinned_options): the same
                              // bits on every x86-64 CPU, where bf16 takes each CPU's own path
                              " --teacher.compute fp32");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto losses = test::losses(dir);
  const auto [before, after] = eval_before_after(dir);
  ASSERT_EQ(losses.size(), 20u);
  EXPECT_LT(after, before) << "held-out relative MSE did not fall";
  if (std::getenv("WD_RECORD_LOSS_CURVE")) {
    std::ofstream(kCurve) << nlohmann::json{{"command", "train --train.steps 20 --train.seed 7 --teacher.compute fp32 (3 ranks)"},
                                            {"torch", compat::torch_version()},
                                            {"kernels", test::kPinnedKernels},
                                            {"cpu", cpu_description()},
                                            {"losses", losses}}.dump(2) << "\n";
  }
  ASSERT_TRUE(fs::exists(kCurve)) << "no golden loss curve for LibTorch " << compat::torch_version() << ": record "
                                  << kCurve << " with WD_RECORD_LOSS_CURVE=1 (docs/training.md)";
  const auto file = nlohmann::json::parse(std::ifstream(kCurve));
  const auto golden = file["losses"].get<std::vector<double>>();
  ASSERT_EQ(golden.size(), losses.size());
  const std::string where = "recorded on " + file.value("cpu", std::string("(not recorded)")) + ", run on " +
                            cpu_description() + " (docs/training.md#determinism-and-the-golden-loss-curve)";
  for (std::size_t i = 0; i < losses.size(); ++i) {
    // Same build, one thread per rank: identical up to the printed precision. See docs/training.md.
    EXPECT_NEAR(losses[i], golden[i], 1e-6 * std::max(1.0, std::abs(golden[i]))) << "step " << i + 1 << "; " << where;
  }
  // The saved student is a Wan checkpoint the other tools accept.
  auto ck = WanCheckpoint::open((dir / "student").string());
  EXPECT_TRUE(ck.problems().empty());
  EXPECT_EQ(ck.config().dim, 64);
  EXPECT_EQ(ck.config().num_layers, 2);
}

TEST(Train, TheTinyDefaultLearns) {
  const auto dir = run_dir() / "learns";
  const auto r = train(3, "--run-dir " + dir.string() + " --train.steps 120");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto [before, after] = eval_before_after(dir);
  std::printf("  held-out relative MSE: %.4f -> %.4f\n", before, after);
  EXPECT_LT(after, 0.5 * before);
}

/// The bound of the steady-memory test: 5% of the step-50 value or 8 MiB, whichever is larger.
/// The tiny ranks sit near 200 MiB, where glibc's returning and re-taking freed blocks moves
/// the RSS of a healthy run by up to about 6 MiB between reports; a leak of one batch (or its
/// teacher output) per step would add ~30 MiB over the 150 steps compared.
double steady_bound(double at_step_50) { return std::max(0.05 * at_step_50, 8.0 * 1024 * 1024); }

TEST(Train, MemoryIsSteadyOver200StepsAndReportedForEveryRank) {
  const auto dir = run_dir() / "memory";
  const auto r = train(3, "--run-dir " + dir.string() + " --train.steps 200 --train.log_every 50 "
                          "--memory.report_every 50");
  ASSERT_EQ(r.code, 0) << r.output;
  // One table per report, from rank 0.
  EXPECT_NE(r.output.find("[rank 0/3 teacher] [info] memory at step 200 (peaks since step 150)"),
            std::string::npos) << r.output;
  std::map<std::int64_t, nlohmann::json> reports;  // memory_step -> ranks
  for (const auto& m : test::read_metrics(dir / "metrics.jsonl")) {
    if (m.contains("memory_step")) reports[m["memory_step"].get<std::int64_t>()] = m["ranks"];
  }
  ASSERT_EQ(reports.size(), 4u) << "reports at steps 50, 100, 150, 200";
  for (const auto& [step, ranks] : reports) {
    ASSERT_EQ(ranks.size(), 3u) << "step " << step;
    EXPECT_EQ(ranks[0]["role"], "teacher");
    EXPECT_EQ(ranks[0]["weights_bytes"], 0) << "teachers report no student categories";
    for (int s = 1; s <= 2; ++s) {
      const auto weights = ranks[s]["weights_bytes"].get<std::uint64_t>();
      EXPECT_EQ(ranks[s]["role"], "student");
      EXPECT_GT(weights, 0u);
      EXPECT_EQ(ranks[s]["grads_bytes"].get<std::uint64_t>(), weights) << "fp32 grads";
      EXPECT_EQ(ranks[s]["optimizer_state_bytes"].get<std::uint64_t>(), 2 * weights)
          << "AdamW: exp_avg + exp_avg_sq";
    }
  }
  for (int rank = 0; rank < 3; ++rank) {
    const auto rss = [&](std::int64_t step) { return reports[step][rank]["rss_bytes"].get<double>(); };
    const auto peak = [&](std::int64_t step) { return reports[step][rank]["peak_rss_bytes"].get<double>(); };
    const double bound = steady_bound(rss(50));
    std::printf("  rank %d: RSS %.1f -> %.1f MiB (steps 50 -> 200, bound %.1f MiB), interval peak "
                "%.1f -> %.1f MiB\n", rank, rss(50) / 1048576, rss(200) / 1048576, bound / 1048576,
                peak(100) / 1048576, peak(200) / 1048576);
    EXPECT_LE(rss(200), rss(50) + bound) << "rank " << rank << " grew";
    // Per-interval peaks: the last interval's peak is no higher than the one of steps 51..100.
    EXPECT_EQ(reports[200][rank]["peak_rss_since_step"], 150);
    EXPECT_LE(peak(200), peak(100) + bound) << "rank " << rank << " peak grew";
  }
}

TEST(Train, ProjectionsFeaturesMixedPrecisionAccumulationAndCheckpointingTogether) {
  const auto dir = run_dir() / "memory-features";
  const auto r = train(3, "--run-dir " + dir.string() +
                              " --train.steps 40 --student.in_dim 8 --student.out_dim 8"
                              " --student.features 0:1,1:3 --student.precision bf16-mixed"
                              " --train.grad_accum 2 --student.checkpointing every:2");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto [before, after] = eval_before_after(dir);
  EXPECT_LT(after, before);
  // The student (8 channels) and its projections + feature heads are saved together.
  auto ck = WanCheckpoint::open((dir / "student").string());
  EXPECT_EQ(ck.config().in_dim, 8);
  EXPECT_TRUE(fs::exists(dir / "student" / "distill_heads" / "heads.safetensors"));
}

TEST(Train, TheLauncherReturnsAtOnceWhenEveryRankAgreedOnAnError) {
  // launch/mpirun.sh gives mpirun a 20 s kill grace, which mpirun sleeps through twice after any
  // non-zero exit, even when every rank has left. An error all ranks agreed on before training
  // returns with its exit code without that sleep: about 1-2 s on a quiet host, 6 s on a loaded
  // one, against at least 40 s (twice the grace) without the launcher's early return. The bound
  // is one grace, so a slow host cannot fail it and the sleep it guards against cannot pass it.
  const auto launcher = fs::path(kFixtures).parent_path().parent_path() / "launch" / "mpirun.sh";
  const auto run = [&](const std::string& args) {
    return test::run_captured("timeout 120 bash " + launcher.string() + " -np 3 " + WD_CLI + " train " +
                              test::pinned_args(args) + " 2>&1");
  };
  const auto bad = run("--run-dir " + (run_dir() / "launcher").string() + " --train.eval_samples 6");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("train.eval_samples(6) must be a multiple of the global batch 4"), std::string::npos)
      << bad.output;
  EXPECT_LT(bad.seconds, 20.0) << bad.output;
  // A job that trains returns its own code through the launcher.
  const auto good = run("--run-dir " + (run_dir() / "launcher").string() + " --train.steps 2 --log.level warn");
  EXPECT_EQ(good.code, 0) << good.output;
}

}  // namespace
}  // namespace wd::test_train_launch
