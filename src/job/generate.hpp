// `generate`: a job of teacher ranks that writes the teacher cache a `train` with the same keys
// reads (data.teacher_cache; docs/teacher-cache.md).
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

/// The cache `generate --students S --shard-positions P` writes for `cfg`'s keys: one stream per
/// student rank of the reading train, train.batch_size samples a message, the held-out messages
/// (train.eval_samples over train.batch_size x S) and train.steps x train.grad_accum training
/// messages each. ConfigError naming the values when S, P or train.eval_samples allow none.
teacher::CacheLayout cache_layout(const RunConfig& cfg, int students, std::int64_t shard_positions);

/// Runs `generate` on this MPI rank (MPI not yet initialised): train's start-up with every rank
/// holding a whole teacher, the cache's identity claimed, then this rank's shards (shard i on
/// rank i mod world), skipping those a killed run completed; the rank that completes the last
/// shard writes the index. Returns the exit code.
int run_generate_job(GenerateJob& job);

}  // namespace wd::job
