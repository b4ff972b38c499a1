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
  std::int64_t shard_positions = 64;  ///< --shard-positions: messages (with --keep: rounds) per shard
  std::string keep;                   ///< --keep: "" (the batches), all or K (whole trajectories)
};

/// generate --keep `keep` for `cfg`'s keys: 0 for "" (the cache holds the batches), else the
/// trajectory intervals stored, K (teacher.steps for "all"). ConfigError naming --keep unless the
/// objective streams trajectories, K divides teacher.steps and student.steps divides K (the
/// train of these keys reads the cache too).
std::int64_t keep_intervals(const RunConfig& cfg, const std::string& keep);

/// The cache `generate --students S --shard-positions P` writes for `cfg`'s keys: one stream per
/// student rank of the reading train, train.batch_size samples a message, the held-out messages
/// (train.eval_samples over train.batch_size x S) and train.steps x train.grad_accum training
/// messages each. With `keep` K > 0 (keep_intervals), rounds of whole trajectories instead: as
/// many held-out rounds as held-out messages (enough for a student of any student.steps), and
/// the training rounds a train of these keys samples over train.steps, `per_round` trained
/// intervals (batches) a round. ConfigError naming the values when S, P or train.eval_samples
/// allow none.
teacher::CacheLayout cache_layout(const RunConfig& cfg, int students, std::int64_t shard_positions,
                                  std::int64_t keep = 0, std::int64_t per_round = 1);

/// Runs `generate` on this MPI rank (MPI not yet initialised): train's start-up with every rank
/// holding a whole teacher, the cache's identity claimed, then this rank's shards (shard i on
/// rank i mod world), skipping those a killed run completed; the rank that completes the last
/// shard writes the index. Returns the exit code.
int run_generate_job(GenerateJob& job);

}  // namespace wd::job
