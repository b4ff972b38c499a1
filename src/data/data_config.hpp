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
              "cache holds)");
  }
  void validate(ConfigProblems& p) const {
    p.check(!path.empty(), "data.path must not be empty");
    p.check(builtin_samples >= 2,
            "data.builtin_samples(" + std::to_string(builtin_samples) + ") must be >= 2");
  }
};

}  // namespace wd::data
