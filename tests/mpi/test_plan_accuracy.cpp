// The planner against measurement: `wan-distill plan --cpu` before a run, then `train` on 3
// ranks; each rank's lifetime peak RSS (summary.json) must be within 15% of the prediction.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "launch_util.hpp"

namespace wd {
namespace {

namespace fs = std::filesystem;
const std::string kCli = WD_CLI;

/// stdout of `wan-distill <args>`; fails the test on a non-zero exit.
std::string run_cli(const std::string& args) {
  FILE* pipe = ::popen((kCli + " " + args + " 2>/dev/null").c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (pipe && std::fgets(buf.data(), buf.size(), pipe)) out += buf.data();
  const int status = pipe ? ::pclose(pipe) : -1;
  EXPECT_EQ(status, 0) << "wan-distill " << args << "\n" << out;
  return out;
}

/// Predicts with `plan --cpu`, trains, and compares every rank's peak RSS with the prediction.
void expect_prediction_within_15_percent(const std::string& name, const std::string& job_args) {
  const auto dir = test::fresh_dir("plan-" + name);
  const std::string args = "--run-dir " + dir.string() + " --train.steps 20 --memory.report_every 0 " + job_args;
  const auto plan = nlohmann::json::parse(run_cli("plan --cpu --np 3 --json " + args));
  nlohmann::json cpu;
  for (const auto& p : plan["placements"]) {
    if (p["placement"] == "cpu") cpu = p;
  }
  ASSERT_TRUE(cpu.is_object() && cpu["applicable"].get<bool>()) << plan.dump(2);
  const double predicted[2] = {cpu["teacher"]["host_bytes"].get<double>(), cpu["student"]["host_bytes"].get<double>()};

  const auto run = test::launch_train(3, args);
  ASSERT_EQ(run.code, 0) << run.output;
  std::ifstream in(dir / "summary.json");
  const auto summary = nlohmann::json::parse(in);
  ASSERT_EQ(summary["ranks"].size(), 3u);
  for (const auto& r : summary["ranks"]) {
    const double measured = r["peak_rss_bytes"].get<double>();
    const double want = predicted[r["role"] == "teacher" ? 0 : 1];
    const double error = (want - measured) / measured;
    std::printf("%s rank %d %s: predicted %.1f MiB, measured %.1f MiB, error %+.1f%%\n", name.c_str(),
                r["rank"].get<int>(), r["role"].get<std::string>().c_str(), want / (1 << 20),
                measured / (1 << 20), 100 * error);
    EXPECT_LT(std::abs(error), 0.15) << name << " rank " << r["rank"] << ": predicted " << want
                                     << " bytes, measured " << measured;
  }
  fs::remove_all(dir);
}

TEST(PlanAccuracy, TinyDefaultJob) { expect_prediction_within_15_percent("tiny", ""); }

TEST(PlanAccuracy, LargerTeacherAndStudent) {
  // A teacher of 4 blocks of dim 256 (bf16) and a student of the same size.
  const auto teacher = test::fresh_dir("plan-teacher-d256");
  run_cli("init-teacher --preset tiny --dim 256 --ffn-dim 1024 --num-heads 4 --num-layers 4 --dtype bf16 "
          "--log.level warn --output " + teacher.string());
  expect_prediction_within_15_percent(
      "d256", "--teacher.checkpoint " + teacher.string() +
                  " --student.dim 256 --student.ffn_dim 1024 --student.num_heads 4 --student.num_layers 4");
  fs::remove_all(teacher);
}

}  // namespace
}  // namespace wd
