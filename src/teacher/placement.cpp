// Shard maps, balanced stages and the teacher's device.
#include "teacher/placement.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "core/errors.hpp"
#include "core/topology.hpp"
#include "core/torch_compat.hpp"

namespace wd::teacher {

plan::Placement parse_placement(const std::string& name) {
  for (const auto p : plan::all_placements()) {
    if (plan::placement_name(p) == name) return p;
  }
  throw ConfigError("teacher.placement(" + name + ") must be gpu, cpu, stream or shard here");
}

std::vector<BlockRange> parse_shard_map(const std::string& map, std::int64_t num_layers) {
  const auto fail = [&](const std::string& why) {
    throw ConfigError("teacher.shard_map(" + map + "): " + why + "; expected contiguous ranges "
                      "covering blocks 0-" + std::to_string(num_layers - 1) + " such as 0-" +
                      std::to_string(num_layers / 2 - 1) + "," + std::to_string(num_layers / 2) +
                      "-" + std::to_string(num_layers - 1));
  };
  std::vector<BlockRange> ranges;
  std::stringstream in(map);
  std::string part;
  while (std::getline(in, part, ',')) {
    part.erase(std::remove(part.begin(), part.end(), ' '), part.end());
    const auto dash = part.find('-');
    std::int64_t lo = 0, hi = 0;
    try {
      std::size_t used = 0;
      lo = std::stoll(part.substr(0, dash), &used);
      if (used != dash && dash != std::string::npos) fail("'" + part + "' is not FIRST-LAST");
      hi = dash == std::string::npos ? lo : std::stoll(part.substr(dash + 1), &used);
      if (dash != std::string::npos && used != part.size() - dash - 1) fail("'" + part + "' is not FIRST-LAST");
    } catch (const std::logic_error&) {
      fail("'" + part + "' is not FIRST-LAST");
    }
    const std::int64_t expected = ranges.empty() ? 0 : ranges.back().end;
    if (lo != expected) fail("range '" + part + "' starts at " + std::to_string(lo) + ", not " + std::to_string(expected));
    if (hi < lo) fail("range '" + part + "' ends before it starts");
    if (hi >= num_layers) fail("range '" + part + "' reaches past the last block " + std::to_string(num_layers - 1));
    ranges.push_back({lo, hi + 1});
  }
  if (ranges.empty()) fail("no ranges");
  if (ranges.back().end != num_layers) {
    fail("blocks " + std::to_string(ranges.back().end) + "-" + std::to_string(num_layers - 1) + " are in no stage");
  }
  return ranges;
}

std::vector<BlockRange> balance_shards(const std::vector<std::uint64_t>& block_bytes,
                                       std::uint64_t last_extra, int stages) {
  const auto L = static_cast<std::int64_t>(block_bytes.size());
  WD_CHECK_AS(ConfigError, stages >= 1 && stages <= L,
              "teacher.stages(" << stages << ") must be in 1.." << L << " (one block per stage at least)");
  std::vector<std::uint64_t> prefix(static_cast<std::size_t>(L) + 1, 0);
  for (std::int64_t i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + block_bytes[static_cast<std::size_t>(i)];
  const auto bytes = [&](std::int64_t a, std::int64_t b, bool last) {
    return prefix[static_cast<std::size_t>(b)] - prefix[static_cast<std::size_t>(a)] + (last ? last_extra : 0);
  };
  // best[k][i]: the smallest possible largest stage when blocks [i, L) form the last k stages.
  constexpr auto kInf = std::numeric_limits<std::uint64_t>::max();
  const auto P = static_cast<std::size_t>(stages);
  const auto Lz = static_cast<std::size_t>(L);
  std::vector<std::vector<std::uint64_t>> best(P + 1, std::vector<std::uint64_t>(Lz + 1, kInf));
  best[0][Lz] = 0;
  for (std::size_t k = 1; k <= P; ++k) {
    for (std::int64_t i = L - static_cast<std::int64_t>(k); i >= 0; --i) {
      for (std::int64_t j = i + 1; j <= L - static_cast<std::int64_t>(k) + 1; ++j) {
        const auto rest = best[k - 1][static_cast<std::size_t>(j)];
        if (rest == kInf || (k == 1 && j != L)) continue;
        const auto cost = std::max(rest, bytes(i, j, k == 1));
        best[k][static_cast<std::size_t>(i)] = std::min(best[k][static_cast<std::size_t>(i)], cost);
      }
    }
  }
  // Of the splits reaching the optimum, the most even: each stage takes the share of what is
  // left closest to an equal one, among the cuts that keep the rest within the optimum.
  const auto limit = best[P][0];
  std::vector<BlockRange> ranges;
  std::int64_t begin = 0;
  for (std::size_t k = P; k >= 1; --k) {
    if (k == 1) {
      ranges.push_back({begin, L});
      break;
    }
    const double target = static_cast<double>(bytes(begin, L, true)) / static_cast<double>(k);
    std::int64_t pick = -1;
    double pick_gap = 0;
    for (std::int64_t end = begin + 1; end <= L - static_cast<std::int64_t>(k) + 1; ++end) {
      if (bytes(begin, end, false) > limit || best[k - 1][static_cast<std::size_t>(end)] > limit) continue;
      const double gap = std::abs(static_cast<double>(bytes(begin, end, false)) - target);
      if (pick < 0 || gap <= pick_gap) {  // on a tie the larger stage, so earlier stages lead
        pick = end;
        pick_gap = gap;
      }
    }
    ranges.push_back({begin, pick});
    begin = pick;
  }
  return ranges;
}

int stages_for(const TeacherConfig& config, plan::Placement placement) {
  if (placement != plan::Placement::kShard) return 1;
  if (config.stages > 0) return config.stages;
  if (!config.shard_map.empty()) {
    return static_cast<int>(std::count(config.shard_map.begin(), config.shard_map.end(), ',')) + 1;
  }
  return config.ranks;
}

std::vector<BlockRange> stage_ranges(const TeacherConfig& config, int stages,
                                     const std::vector<std::uint64_t>& block_bytes,
                                     std::uint64_t last_extra) {
  if (config.shard_map.empty()) return balance_shards(block_bytes, last_extra, stages);
  auto ranges = parse_shard_map(config.shard_map, static_cast<std::int64_t>(block_bytes.size()));
  WD_CHECK_AS(ConfigError, static_cast<int>(ranges.size()) == stages,
              "teacher.shard_map(" << config.shard_map << ") has " << ranges.size()
                                   << " ranges but teacher.stages is " << stages);
  return ranges;
}

c10::Device teacher_device(const TeacherConfig& config, plan::Placement placement, int local_rank) {
  if (placement == plan::Placement::kCpu) return torch::kCPU;
  if (!config.device.empty()) {
    const c10::Device device(config.device);
    WD_CHECK_AS(ConfigError, device.is_cpu() || compat::cuda_available(),
                "teacher.device(" << config.device << "): this LibTorch has no CUDA");
    return device;
  }
  if (compat::cuda_available()) {
    const auto count = static_cast<int>(torch::cuda::device_count());
    return {torch::kCUDA, static_cast<c10::DeviceIndex>(gpu_of_local_rank(local_rank, count))};
  }
  WD_CHECK_AS(ConfigError, placement != plan::Placement::kGpu,
              "teacher.placement(gpu) needs a GPU: "
                  << (compat::kHasCuda ? "this rank sees none (CUDA_VISIBLE_DEVICES, the driver)"
                                       : "this build's LibTorch has no CUDA")
                  << " (use cpu, stream, shard or auto)");
  return torch::kCPU;  // stream and shard with the host as their device
}

}  // namespace wd::teacher
