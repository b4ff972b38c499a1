// DataConfig: the `[data]` section (which data set, how much of it is held out).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"

namespace wd::data {

/// data.teacher_cache_end: what a run from a teacher cache does past the cache's last training
/// batch: cycle (read it again from the start) | stop (refused before training when
/// train.steps needs more batches than the cache holds).
enum class CacheEnd { kCycle, kStop };
inline const std::vector<std::pair<CacheEnd, const char*>>& choices(CacheEnd) {
  static const std::vector<std::pair<CacheEnd, const char*>> names{{CacheEnd::kCycle, "cycle"},
                                                                    {CacheEnd::kStop, "stop"}};
  return names;
}

struct DataConfig {
  /// HDF5 file, or `builtin:tiny` for the synthetic set generated into the run's cache.
  std::string path = "builtin:tiny";
  std::int64_t builtin_samples = 72;  ///< size of the generated builtin set
  /// A t2v teacher's data set may hold image conditions (/condition): true trains on the videos
  /// alone, false (the default) refuses the data set, naming the dataset.
  bool ignore_condition = false;
  /// A teacher cache written by `generate` (docs/teacher-cache.md): the students read their
  /// batches from it, with no teacher rank (teacher.ranks 0). Empty: the teacher's stream.
  std::string teacher_cache;
  CacheEnd teacher_cache_end = CacheEnd::kCycle;  ///< past the cache's end (CacheEnd)
  /// A teacher cache this train writes as it streams (docs/teacher-cache.md): the batches its
  /// teacher ranks (or colocated teachers) make, appended to a cache later trains read with
  /// data.teacher_cache. Empty: none.
  std::string teacher_cache_write;
  std::int64_t teacher_cache_shard_positions = 64;  ///< messages per shard of teacher_cache_write

  void bind(OptionTable& table) {
    table.bind("data.path", path, "HDF5 data set (docs/data-format.md), or builtin:tiny")
        .bind("data.builtin_samples", builtin_samples, "samples in the generated builtin:tiny set")
        .bind("data.ignore_condition", ignore_condition,
              "a data set with image conditions (/condition): train on the videos alone, a t2v teacher "
              "instead of refusing it, a ti2v teacher's text-to-video mode instead of its image mode "
              "(an i2v teacher needs them)")
        .bind("data.teacher_cache", teacher_cache,
              "a teacher cache written by `wan-distill generate --output DIR` with the same keys: every rank a "
              "student (teacher.ranks 0) reading the batches the teacher would have sent (dmd with its regression "
              "term: teacher ranks, or colocated teachers, answer the real score alone); empty = the teacher's "
              "stream (docs/teacher-cache.md)")
        .bind("data.teacher_cache_end", teacher_cache_end,
              "past the last training batch of data.teacher_cache: cycle (read the cache again from the start, "
              "with a log line) | stop (refuse, before training, a train.steps that needs more batches than the "
              "cache holds)")
        .bind("data.teacher_cache_write", teacher_cache_write,
              "a folder where this train also writes the batches its teacher ranks (or colocated teachers) stream, "
              "as a teacher cache that later trains of the same keys read with data.teacher_cache and no teacher "
              "(the shards generate writes; a stopped or resumed run completes it); empty = none "
              "(docs/teacher-cache.md)")
        .bind("data.teacher_cache_shard_positions", teacher_cache_shard_positions,
              "messages per shard of data.teacher_cache_write (generate's --shard-positions; a multiple of "
              "student.steps keeps a trajectory round in one shard)");
  }
  void validate(ConfigProblems& p) const {
    p.check(!path.empty(), "data.path must not be empty");
    p.check(builtin_samples >= 2,
            "data.builtin_samples(" + std::to_string(builtin_samples) + ") must be >= 2");
    p.check(teacher_cache_shard_positions >= 1, "data.teacher_cache_shard_positions(" +
                                                    std::to_string(teacher_cache_shard_positions) + ") must be >= 1");
    p.check(teacher_cache.empty() || teacher_cache_write.empty(),
            "data.teacher_cache(" + teacher_cache + ") and data.teacher_cache_write(" + teacher_cache_write +
                "): a train reads a cache or writes one, not both");
  }
};

}  // namespace wd::data
