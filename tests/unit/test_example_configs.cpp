// Every shipped example config fits the hardware its comment names: `wan-distill plan` on it,
// with the flags of its `# plan:` line, recommends a teacher placement. Checked by launching the
// binary (the planner's wiring lives in the executable), so a config that stops fitting after a
// change to the planner or to the config fails here, not on the first real cluster.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.hpp"

namespace test_example_configs {
namespace {

namespace fs = std::filesystem;

const std::string kCli = WD_CLI;
const std::string kConfigs = WD_CONFIGS;
constexpr const char* kPlanTag = "# plan:";

std::vector<fs::path> example_configs() {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kConfigs)) {
    if (e.path().extension() == ".ini") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

/// The flags of the config's `# plan:` line (one line, required): the hardware and, where the
/// checkpoint and data set are not here, the preset and latent size that stand in for them.
std::vector<std::string> plan_lines(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> found;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(kPlanTag, 0) == 0) found.push_back(line.substr(std::string(kPlanTag).size()));
  }
  return found;
}

TEST(ExampleConfigs, EveryConfigNamesItsHardwareInAPlanLine) {
  const auto files = example_configs();
  ASSERT_GE(files.size(), 3u) << "configs/ holds tiny.ini and the two real-size examples";
  for (const auto& f : files) {
    EXPECT_EQ(plan_lines(f).size(), 1u) << f << " needs exactly one '" << kPlanTag << " <plan flags>' line";
  }
}

TEST(ExampleConfigs, PlanRecommendsAPlacementForEachOnItsHardware) {
  for (const auto& f : example_configs()) {
    const auto lines = plan_lines(f);
    if (lines.size() != 1) continue;  // reported by the test above
    // --calibrate no: the tiny CPU job would otherwise time its models; the fit does not depend
    // on speed. `timeout` bounds a hang.
    const std::string plan = "timeout 300 " + kCli + " plan --config " + f.string() + " " + lines.front() +
                             " --calibrate no";
    const auto r = wd::test::run_command("(" + plan + " --json 2>/dev/null)");
    ASSERT_EQ(r.code, 0) << plan << "\n" << wd::test::run_command(plan).output;
    const auto j = nlohmann::json::parse(r.output, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << plan << " --json printed no JSON:\n" << r.output;
    EXPECT_NE(j["recommended"].get<std::string>(), "")
        << f.filename() << " fits nowhere on the hardware of its plan line (" << j["reason"] << "):\n"
        << wd::test::run_command(plan).output;
  }
}

}  // namespace

}  // namespace test_example_configs
