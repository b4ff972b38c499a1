// `wan-distill train`: parses the options and runs the job (src/job/train.hpp).
#include <iostream>

#include "app/commands.hpp"
#include "job/train.hpp"

namespace wd::app {

int run_train(const std::vector<std::string>& args) {
  job::TrainJob job;
  OptionTable table("train options (INI sections: [teacher] placement = ... is --teacher.placement)");
  job.cfg.bind(table);
  bool print_config = false;
  table.bind("print-config", print_config, "print the effective config as INI and exit (no MPI)");
  if (parse_options(args, table).help) {
    print_help("mpirun -np N wan-distill train [--config FILE] [--run-dir DIR] [--section.key value ...]",
               "Distils the teacher into the student. World ranks 0..teacher.ranks-1 are teachers, the\n"
               "rest students. Without --config it runs the builtin tiny job (configs/tiny.ini).",
               table);
    return kExitOk;
  }
  if (print_config) {
    job.cfg.validate();
    print_config = false;  // not part of the printed file
    std::cout << table.to_ini();
    return kExitOk;
  }
  job.args = args;
  job.config_ini = table.to_ini();
  return job::run_train_job(job);
}

}  // namespace wd::app
