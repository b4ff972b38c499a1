// The memory monitor's parts: RSS and its peak reset, the student categories, the CPU answer
// of the device statistics, the table and metrics line, and the reporting schedule.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "memory/host_memory.hpp"
#include "memory/memory_monitor.hpp"
#include "test_util.hpp"

namespace wd::memory::test_memory {
namespace {

constexpr std::uint64_t kMiB = 1024 * 1024;

TEST(HostMemory, PeakFollowsATouchedBufferAndResetsToTheCurrentRss) {
  const auto before = host_memory();
  ASSERT_GT(before.rss_bytes, 0u);
  ASSERT_GE(before.peak_rss_bytes, before.rss_bytes);
  {
    // 64 MiB, every page touched: resident until freed (glibc returns a block this large to
    // the kernel with munmap at free).
    std::unique_ptr<char[]> block(new char[64 * kMiB]);
    std::memset(block.get(), 1, 64 * kMiB);
    EXPECT_GE(host_memory().rss_bytes, before.rss_bytes + 60 * kMiB);
  }
  const auto after = host_memory();
  EXPECT_GE(after.peak_rss_bytes, before.rss_bytes + 60 * kMiB);
  if (!reset_peak_rss()) GTEST_SKIP() << "this kernel refuses clear_refs 5: " << std::strerror(errno);
  const auto reset = host_memory();
  // After the reset the high-water mark is the current RSS (give or take pages touched since).
  EXPECT_LT(reset.peak_rss_bytes, reset.rss_bytes + 8 * kMiB);
  EXPECT_LT(reset.peak_rss_bytes + 32 * kMiB, after.peak_rss_bytes);
}

TEST(ModelMemory, WeightsGradsAndAdamWStateAreCountedInBytes) {
  torch::manual_seed(0);
  torch::nn::Linear layer(16, 8);  // 16*8 + 8 = 136 floats
  const auto params = layer->parameters();
  EXPECT_EQ(tensor_bytes(params), 136u * 4);
  EXPECT_EQ(grad_bytes(params), 0u) << "no backward yet";
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-3));
  EXPECT_EQ(optimizer_state_bytes(opt), 0u) << "state is created by the first step";
  layer->forward(torch::randn({4, 16})).sum().backward();
  EXPECT_EQ(grad_bytes(params), 136u * 4);
  opt.step();
  EXPECT_EQ(optimizer_state_bytes(opt), 2 * 136u * 4) << "exp_avg + exp_avg_sq";
  torch::optim::AdamW amsgrad(params, torch::optim::AdamWOptions(1e-3).amsgrad(true));
  amsgrad.step();
  EXPECT_EQ(optimizer_state_bytes(amsgrad), 3 * 136u * 4) << "+ max_exp_avg_sq";
}

TEST(DeviceMemory, CpuDevicesReportNotAvailableAndIgnoreEmptyCache) {
  const c10::Device cpu(c10::kCPU);
  EXPECT_FALSE(compat::device_memory(cpu).available);
  EXPECT_FALSE(compat::empty_device_cache(cpu));
  compat::reset_device_peak(cpu);  // a no-op, not an error
  const auto r = measure_memory(Role::kStudent, cpu, {1, 2, 3});
  EXPECT_EQ(r.role, Role::kStudent);
  EXPECT_GT(r.rss_bytes, 0u);
  EXPECT_EQ(r.model.optimizer_state_bytes, 3u);
  EXPECT_FALSE(r.device.available);
}

std::vector<MemoryReport> two_ranks() {
  MemoryReport teacher;
  teacher.rss_bytes = 100 * kMiB;
  teacher.peak_rss_bytes = 120 * kMiB;
  MemoryReport student;
  student.role = Role::kStudent;
  student.rss_bytes = 50 * kMiB;
  student.peak_rss_bytes = 60 * kMiB;
  student.model = {4 * kMiB, 4 * kMiB, 8 * kMiB};
  return {teacher, student};
}

TEST(MemoryMonitor, TableAndMetricsLineNameEveryRank) {
  auto reports = two_ranks();
  const auto table = format_memory_table(100, 50, reports);
  EXPECT_TRUE(test::contains(table, "memory at step 100 (peaks since step 50)")) << table;
  EXPECT_TRUE(test::contains(table, "100.00 MiB")) << table;
  EXPECT_TRUE(test::contains(table, "8.00 MiB")) << table;
  EXPECT_TRUE(test::contains(table, "device memory: not available")) << table;
  const auto line = nlohmann::json::parse(memory_metrics_line(100, 50, reports));
  EXPECT_EQ(line["memory_step"], 100);
  ASSERT_EQ(line["ranks"].size(), 2u);
  EXPECT_EQ(line["ranks"][0]["role"], "teacher");
  EXPECT_EQ(line["ranks"][1]["optimizer_state_bytes"], 8 * kMiB);
  EXPECT_EQ(line["ranks"][1]["peak_rss_since_step"], 50);
  EXPECT_TRUE(line["ranks"][1]["device"].is_null());

  reports[1].peak_rss_is_lifetime = true;
  reports[1].device.available = true;
  reports[1].device.allocated_bytes = 3 * kMiB;
  EXPECT_TRUE(test::contains(format_memory_table(100, 50, reports), "peak since process start"));
  EXPECT_TRUE(test::contains(format_memory_table(100, 50, reports), "3.00 MiB"));
  const auto again = nlohmann::json::parse(memory_metrics_line(100, 50, reports));
  EXPECT_EQ(again["ranks"][1]["peak_rss_since_step"], 0);
  EXPECT_EQ(again["ranks"][1]["device"]["allocated_bytes"], 3 * kMiB);
}

TEST(MemoryMonitor, ReportsEveryNStepsWithPerIntervalPeaks) {
  test::TempDir dir("wd-memory");
  MemoryConfig cfg;
  cfg.report_every = 4;
  int gathers = 0;
  MemoryMonitor monitor(
      cfg, Role::kStudent,
      [&](std::int64_t, const MemoryReport& mine) {
        ++gathers;
        return std::vector<MemoryReport>{mine};
      },
      dir.str("metrics.jsonl"));
  int measured = 0;
  for (std::int64_t step = 1; step <= 10; ++step) {
    monitor.after_step(step, c10::Device(c10::kCPU), [&] {
      ++measured;
      return ModelMemory{1, 2, 3};
    });
  }
  EXPECT_EQ(gathers, 2);
  EXPECT_EQ(measured, 2) << "the categories are counted only when a report is due";
  std::ifstream in(dir.str("metrics.jsonl"));
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["memory_step"], 4);
  EXPECT_EQ(lines[0]["peaks_since_step"], 0);
  EXPECT_EQ(lines[1]["memory_step"], 8);
  EXPECT_EQ(lines[1]["peaks_since_step"], 4);
  EXPECT_EQ(lines[1]["ranks"][0]["grads_bytes"], 2);
  // The resets hide earlier peaks from VmHWM; the monitor still knows the lifetime peak.
  for (const auto& line : lines) {
    EXPECT_GE(monitor.lifetime_peak_rss(), line["ranks"][0]["peak_rss_bytes"].get<std::uint64_t>());
  }
}

TEST(MemoryMonitor, AnAsynchronousGatherIsPublishedWhenItCompletesAndAtFinish) {
  // The gather of step 4 completes only when the other ranks get there (here: two steps later);
  // the monitor keeps going meanwhile and publishes it then, with step 4 and its interval.
  test::TempDir dir("wd-memory-async");
  MemoryConfig cfg;
  cfg.report_every = 4;
  std::vector<std::int64_t> posted;
  std::int64_t now = 0;
  MemoryMonitor::AsyncGather gather;
  std::optional<std::pair<std::int64_t, MemoryReport>> flight;
  gather.post = [&](std::int64_t step, const MemoryReport& mine) {
    posted.push_back(step);
    flight.emplace(step, mine);
  };
  gather.collect = [&](bool wait) -> std::optional<MemoryMonitor::Gathered> {
    if (!flight || (!wait && now < flight->first + 2)) return std::nullopt;
    MemoryMonitor::Gathered g{flight->first, {flight->second}};
    flight.reset();
    return g;
  };
  MemoryMonitor monitor(cfg, Role::kTeacher, gather, dir.str("metrics.jsonl"));
  const auto lines = [&] {
    std::ifstream in(dir.str("metrics.jsonl"));
    std::vector<nlohmann::json> out;
    for (std::string l; std::getline(in, l);) out.push_back(nlohmann::json::parse(l));
    return out;
  };
  for (now = 1; now <= 5; ++now) monitor.after_step(now, c10::Device(c10::kCPU));
  EXPECT_EQ(posted, std::vector<std::int64_t>({4}));
  EXPECT_TRUE(lines().empty()) << "published before the gather completed";
  now = 6;
  monitor.after_step(6, c10::Device(c10::kCPU));
  ASSERT_EQ(lines().size(), 1u);
  EXPECT_EQ(lines()[0]["memory_step"], 4);
  EXPECT_EQ(lines()[0]["peaks_since_step"], 0);
  for (now = 7; now <= 8; ++now) monitor.after_step(now, c10::Device(c10::kCPU));
  EXPECT_EQ(posted, std::vector<std::int64_t>({4, 8}));
  monitor.finish();  // the loop is done: step 8's gather is waited for and published
  ASSERT_EQ(lines().size(), 2u);
  EXPECT_EQ(lines()[1]["memory_step"], 8);
  EXPECT_EQ(lines()[1]["peaks_since_step"], 4);
  monitor.finish();  // nothing in flight: nothing more
  EXPECT_EQ(lines().size(), 2u);
}

TEST(MemoryMonitor, ZeroTurnsItOffAndNegativeValuesAreRejected) {
  MemoryConfig cfg;
  cfg.report_every = 0;
  int gathers = 0;
  MemoryMonitor monitor(cfg, Role::kTeacher, [&](std::int64_t, const MemoryReport& m) {
    ++gathers;
    return std::vector<MemoryReport>{m};
  });
  for (std::int64_t step = 1; step <= 100; ++step) monitor.after_step(step, c10::Device(c10::kCPU));
  EXPECT_EQ(gathers, 0);

  cfg.report_every = -1;
  cfg.empty_cache_every = -2;
  ConfigProblems p;
  cfg.validate(p);
  ASSERT_EQ(p.list().size(), 2u);
  EXPECT_EQ(p.list()[0], "memory.report_every(-1) must be >= 0");
  EXPECT_EQ(p.list()[1], "memory.empty_cache_every(-2) must be >= 0");
}

}  // namespace
}  // namespace wd::memory::test_memory
