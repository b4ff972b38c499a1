// The planner against measurement: `wan-distill plan --cpu` before a run, then `train` on 3
// ranks; each rank's lifetime peak RSS (summary.json) must be within 15% of the prediction, and
// where the formulas predict most of a rank's memory, their part alone must be too.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "launch_util.hpp"

namespace wd::test_plan_accuracy {
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

/// The planner's prediction for one role, whole and without its fixed per-process constant.
struct Predicted {
  double total = 0;
  double formulas = 0;  ///< total less the "framework overhead" item
};

Predicted predicted_for(const nlohmann::json& role) {
  Predicted p;
  p.total = role["host_bytes"].get<double>();
  p.formulas = p.total;
  for (const auto& item : role["items"]) {
    if (item["name"] == "framework overhead") p.formulas -= item["host_bytes"].get<double>();
  }
  return p;
}

/// Predicts with `plan --cpu`, trains, and compares every rank's peak RSS with the prediction.
/// A fixed constant (the per-process framework overhead, 192 MiB) is most of a small rank's
/// prediction, so the total alone would pass with every formula at zero: where the formulas
/// predict at least half of a rank's total, their part (prediction less the constant) is also
/// compared with the measured peak less the rank's RSS at the end of start-up (summary.json's
/// start_rss_bytes, before any model), the part the constant does not stand for. Returns the
/// number of ranks whose formula part was checked.
int expect_prediction_within_15_percent(const std::string& name, const std::string& job_args) {
  const auto dir = test::fresh_dir("plan-" + name);
  // The run's own pins (threads, host devices) in the plan's arguments too: `plan --cpu` then
  // predicts the very job that launch_train starts, on any machine.
  const std::string args =
      test::pinned_args("--run-dir " + dir.string() + " --train.steps 20 --memory.report_every 0 " + job_args);
  const auto plan = nlohmann::json::parse(run_cli("plan --cpu --np 3 --json " + args));
  nlohmann::json cpu;
  for (const auto& p : plan["placements"]) {
    if (p["placement"] == "cpu") cpu = p;
  }
  EXPECT_TRUE(cpu.is_object() && cpu["applicable"].get<bool>()) << plan.dump(2);
  if (!cpu.is_object()) return 0;
  const Predicted predicted[2] = {predicted_for(cpu["teacher"]), predicted_for(cpu["student"])};

  const auto run = test::launch_train(3, args);
  EXPECT_EQ(run.code, 0) << run.output;
  std::ifstream in(dir / "summary.json");
  const auto summary = nlohmann::json::parse(in);
  EXPECT_EQ(summary["ranks"].size(), 3u);
  int formula_checks = 0;
  for (const auto& r : summary["ranks"]) {
    const double measured = r["peak_rss_bytes"].get<double>();
    const auto& want = predicted[r["role"] == "teacher" ? 0 : 1];
    const double error = (want.total - measured) / measured;
    std::printf("%s rank %d %s: predicted %.1f MiB, measured %.1f MiB, error %+.1f%%\n", name.c_str(),
                r["rank"].get<int>(), r["role"].get<std::string>().c_str(), want.total / (1 << 20),
                measured / (1 << 20), 100 * error);
    EXPECT_LT(std::abs(error), 0.15) << name << " rank " << r["rank"] << ": predicted " << want.total
                                     << " bytes, measured " << measured;
    if (want.formulas < 0.5 * want.total) continue;
    const double start = r["start_rss_bytes"].get<double>();
    EXPECT_GT(start, 0) << "summary.json has the rank's start-up RSS";
    const double grown = measured - start;
    const double part_error = (want.formulas - grown) / grown;
    std::printf("%s rank %d: formulas predict %.1f MiB, measured peak - start-up RSS %.1f MiB, error %+.1f%%\n",
                name.c_str(), r["rank"].get<int>(), want.formulas / (1 << 20), grown / (1 << 20), 100 * part_error);
    EXPECT_LT(std::abs(part_error), 0.15) << name << " rank " << r["rank"] << ": the formulas predict "
                                          << want.formulas << " bytes, the rank grew by " << grown;
    ++formula_checks;
  }
  fs::remove_all(dir);
  return formula_checks;
}

TEST(PlanAccuracy, TinyDefaultJob) {
  // Every rank is mostly the fixed constant here: the total is checked, not the formulas.
  expect_prediction_within_15_percent("tiny", "");
}

TEST(PlanAccuracy, LargerTeacherAndStudent) {
  // A teacher of 4 blocks of dim 256 (bf16) and a student of the same size.
  const auto teacher = test::fresh_dir("plan-teacher-d256");
  run_cli("init-teacher --preset tiny --dim 256 --ffn-dim 1024 --num-heads 4 --num-layers 4 --dtype bf16 "
          "--log.level warn --output " + teacher.string());
  // The students' formulas are over half of their prediction with Debian's LibTorch (192 MiB
  // per process) and under half with the CUDA LibTorch's 392 MiB: checked where they are.
  expect_prediction_within_15_percent(
      "d256", "--teacher.checkpoint " + teacher.string() +
                  " --student.dim 256 --student.ffn_dim 1024 --student.num_heads 4 --student.num_layers 4");
  fs::remove_all(teacher);
}

TEST(PlanAccuracy, FormulasOfALargeStudent) {
  // Weights, gradients, AdamW state and activations of a dim-512 student: over half of its
  // prediction in both builds (3.3x the constant of Debian's LibTorch, 1.6x the CUDA LibTorch's).
  const int checked = expect_prediction_within_15_percent(
      "student-d512", "--student.dim 512 --student.ffn_dim 2048 --student.num_heads 8 --student.num_layers 4");
  EXPECT_EQ(checked, 2);
}

}  // namespace
}  // namespace wd::test_plan_accuracy
