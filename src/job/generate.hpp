// `generate`: a job of teacher ranks that writes the teacher cache a `train` with the same keys
// reads (data.teacher_cache), and the train side's identity and checks of a cache
// (docs/teacher-cache.md).
#pragma once

#include <cstdint>
#include <string>

#include "job/train_job.hpp"
#include "teacher/teacher_cache.hpp"

namespace wd::job {

/// What `wan-distill generate` runs: train's keys (cfg, args, config_ini set) and its own.
struct GenerateJob {
  TrainJob train;
  std::string output;                 ///< --output: the cache's folder
  int students = 1;                   ///< --students: student ranks of the train that reads it
  std::int64_t shard_positions = 64;  ///< --shard-positions: messages per shard
};

/// Runs `generate` on this MPI rank (MPI not yet initialised): train's start-up with every rank
/// holding a whole teacher, the cache's identity claimed, then this rank's shards (shard i on
/// rank i mod world), skipping those a killed run completed; the rank that completes the last
/// shard writes the index. Returns the exit code.
int run_generate_job(GenerateJob& job);

/// The identity of the stream of `cfg`'s job with `teacher` and `data` (teacher::CacheIdentity): the keys that decide its batches as
/// the config writes them, the teacher's files' xxh64, teacher.negative's, and the data set's
/// fingerprint (its size and shapes and the xxh64 of its first and last samples as read).
teacher::CacheIdentity cache_identity(const RunConfig& cfg, const WanExperts& teacher, const data::DatasetInfo& data);

/// data.teacher_cache on this rank, before training: the index read, its identity and layout
/// against `job`'s (one stream per student rank, train.batch_size, the held-out messages), this
/// rank's stream verified (teacher::verify_stream), and rank 0 logs what it covers.
void check_teacher_cache(const TrainJob& job);

}  // namespace wd::job
