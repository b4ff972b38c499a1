// Teacher placement: which blocks a teacher rank holds (shard maps, balanced stages) and on
// which device it computes.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "plan/planner.hpp"
#include "teacher/teacher_config.hpp"

namespace wd::teacher {

/// Blocks [begin, end) of the DiT.
struct BlockRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const { return end - begin; }
  bool operator==(const BlockRange& o) const { return begin == o.begin && end == o.end; }
};

/// "gpu" | "cpu" | "stream" | "shard" (not "auto": resolve it first).
plan::Placement parse_placement(const std::string& name);

/// Parses `teacher.shard_map` ("0-13,14-27,28-39"): contiguous ranges covering blocks
/// 0..num_layers-1 in order, each at least one block. Throws ConfigError naming the map, the
/// offending range and what was expected.
std::vector<BlockRange> parse_shard_map(const std::string& map, std::int64_t num_layers);

/// Splits the blocks into `stages` contiguous ranges minimising the largest stage's bytes.
/// `last_extra` is what only the last stage holds (the head); every stage holds the embeddings,
/// so they do not move the split. Among the optimal splits, the most even one.
std::vector<BlockRange> balance_shards(const std::vector<std::uint64_t>& block_bytes,
                                       std::uint64_t last_extra, int stages);

/// Pipeline stages per replica for a resolved placement: 1 unless shard; for shard
/// teacher.stages, else the ranges of shard_map, else teacher.ranks.
int stages_for(const TeacherConfig& config, plan::Placement placement);

/// The block ranges of every stage for the config (shard_map or balanced).
std::vector<BlockRange> stage_ranges(const TeacherConfig& config, int stages,
                                     const std::vector<std::uint64_t>& block_bytes,
                                     std::uint64_t last_extra);

/// The device a teacher rank computes on. cpu: the host. gpu/stream/shard: teacher.device, or
/// cuda:<local_rank mod GPUs>; in a build whose LibTorch has no CUDA, stream and shard run
/// with the host as their device (so their scheduling is tested on CPU) and gpu is refused.
c10::Device teacher_device(const TeacherConfig& config, plan::Placement placement, int local_rank);

}  // namespace wd::teacher
