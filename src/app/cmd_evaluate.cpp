// `wan-distill evaluate`: parses its options and runs the evaluation rows (eval/evaluate.hpp).
#include "app/commands.hpp"
#include "core/logging.hpp"
#include "core/topology.hpp"
#include "eval/evaluate.hpp"

namespace wd::app {

int run_evaluate(const std::vector<std::string>& args) {
  eval::EvaluateConfig cfg;
  OptionTable table("evaluate options");
  cfg.bind(table);
  const auto parsed = parse_options(args, table);
  if (parsed.help) {
    print_help("wan-distill evaluate --teacher.checkpoint T [--student RUN_DIR/student] --data.path D [--count 192] "
               "[--teacher.steps 40 --teacher.guidance g --teacher.shift s --student.steps k] [--output DIR]",
               "Samples every row from the same held-out noises and contexts (by default the data set's last "
               "--count samples): `reference` (the teacher, teacher.steps, guided), `teacher_unguided` (g = 1), "
               "`teacher_at_k` (the teacher at student.steps Euler steps, guided: what a user runs instead of a "
               "distilled student) and `student` (student.steps Euler steps, student.guidance). Each row gets its "
               "paired relative MSE against the reference (and the per-sample median), the Fréchet distance of "
               "fixed latent features to the reference sampled from other noise (frechet_floor: the reference's "
               "own), class and strict accuracy on a classes data set, and a collapse flag; written to "
               "OUTPUT/report.json with every row's latents (docs/objectives.md#evaluate).",
               table);
    return kExitOk;
  }
  cfg.validate();
  cfg.given = parsed.given;
  init_logging(Topology::single_process(), cfg.log.level);
  cfg.runtime.apply();
  eval::run_evaluation(cfg);
  return kExitOk;
}

}  // namespace wd::app
