// `wan-distill generate`: parses train's options and its own, and runs the job (src/job/generate.hpp).
#include "app/commands.hpp"
#include "core/errors.hpp"
#include "job/generate.hpp"

namespace wd::app {

int run_generate(const std::vector<std::string>& args) {
  job::GenerateJob job;
  OptionTable table("generate options: train's (the same file and flags; INI sections as for train), then its own");
  job.train.cfg.bind(table);
  table.bind("output", job.output, "the cache's folder (created; a rerun with the same keys completes a killed one)")
      .bind("students", job.students,
            "student ranks of the train that reads the cache (teacher.ranks 0; dmd: beside its teacher ranks): "
            "one stream of batches each; under student.sequence_parallel N, its groups (ranks / N), a stream each")
      .bind("shard-positions", job.shard_positions,
            "batches per shard (a multiple of student.steps keeps each trajectory round in one shard); with "
            "--keep, trajectory rounds per shard")
      .bind("keep", job.keep,
            "trajectory objectives: store whole teacher trajectories instead of the batches, all (every one of "
            "teacher.steps + 1 states) or K (the states at every teacher.steps/K-th step): students of any "
            "student.steps dividing K read the one cache; unset: the batches of this student.steps");
  if (parse_options(args, table).help) {
    print_help("mpirun -np N wan-distill generate --output DIR [--config FILE] [--students S] [--keep all|K] "
               "[--section.key value ...]",
               "Runs the teacher side of train.objective for train's keys and writes, into DIR, the batches the S\n"
               "student ranks of `train --data.teacher_cache DIR --teacher.ranks 0` with the same keys read: over\n"
               "train.steps, batch for batch what the teacher's stream would send (dmd: its regression term's\n"
               "trajectories; its teacher ranks answer the real score alone). Every rank holds a whole\n"
               "teacher and writes every N-th shard; a killed run resumes (docs/teacher-cache.md). With --keep,\n"
               "the trajectories themselves, which students of other student.steps deal into their own batches.",
               table);
    return kExitOk;
  }
  WD_CHECK_AS(ConfigError, !job.output.empty(), "generate needs --output DIR, the cache's folder");
  job.train.args = args;
  job.train.config_ini = table.to_ini();
  return job::run_generate_job(job);
}

}  // namespace wd::app
