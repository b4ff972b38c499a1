// RunConfig's binding, checks and derived values (run_config.hpp).
#include "job/run_config.hpp"


namespace wd::job {

void RunConfig::bind(OptionTable& t) {
  t.bind("run-dir", run_dir, "directory for metrics.jsonl, the student and the builtin cache");
  t.bind("inject-fault", inject_fault,
         "testing aid: KIND@ROLE:RANK:STEP[:POINT] makes rank RANK of ROLE (teacher|student) fail at "
         "training step STEP with KIND = oom|oom_huge|nan|throw|hang|sigkill|sigterm|sigusr1, at POINT = "
         "step (the step's start; the default) | allreduce (a student, inside the gradient all-reduce) | "
         "send (a teacher, inside the send of the step's batch) | save (student 0, inside the step's "
         "checkpoint save) | serve (a teacher of train.objective dmd, inside a real-score answer) | allgather (a student of "
         "student.shard optimizer, inside the all-gather of the updated parameters), e.g. sigkill@student:1:3:allreduce "
         "(docs/failures.md)");
  teacher.bind(t);
  student.bind(t);
  train.bind(t);
  objective::bind(t, train.objective);
  dmd.bind(t);
  data.bind(t);
  noise.bind(t);
  comm.bind(t);
  memory.bind(t);
  checkpoint.bind(t);
  log.bind(t);
  runtime.bind(t);
  runtime.bind_roles(t);
}

void RunConfig::validate() const {
  ConfigProblems p;
  p.check(!run_dir.empty(), "run-dir must not be empty");
  teacher.validate(p);
  student.validate(p);
  train.validate(p);
  dmd.validate(p);
  data.validate(p);
  noise.validate(p);
  comm.validate(p);
  memory.validate(p);
  checkpoint.validate(p);
  log.validate(p);
  runtime.validate(p);
  check_objective(p);
  try {
    FaultSpec::parse(inject_fault);
  } catch (const ConfigError& e) {
    p.check(false, e.what());
  }
  p.throw_if_any("train config");
}

void RunConfig::check_objective(ConfigProblems& p) const {
  objective::check(keys(), p);
  if (student.shard == ShardMode::kParameters) {
    // What reads every weight at once, or forwards on one student alone, while the blocks are
    // spread over the students.
    p.check(train.ema_decay == 0, "train.ema_decay with student.shard parameters: the weight average would hold "
                                  "every weight on each student; shard gradients, or no average");
    p.check(train.sample_every == 0, "train.sample_every with student.shard parameters: the sampling probe runs on "
                                     "the first student alone, and every block's gather needs all of them");
  }
}

}  // namespace wd::job
