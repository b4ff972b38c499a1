// `wan-distill inspect`: describes a checkpoint and lists every problem found in it.
#include <iostream>

#include "app/commands.hpp"
#include "core/logging.hpp"
#include "model/wan_checkpoint.hpp"

namespace wd::app {

int run_inspect(const std::vector<std::string>& args) {
  std::string model_config;
  LogConfig log;
  log.level = "warn";  // inspect prints its report on stdout; keep the log quiet
  OptionTable table("inspect options");
  table.bind("model-config", model_config, "config.json to use (default: the one in / beside PATH)");
  log.bind(table);
  const auto parsed = parse_options(args, table, "path");
  if (parsed.help) {
    print_help("wan-distill inspect PATH [--model-config FILE]",
               "Describes a checkpoint (directory with an index, directory with one file, or one\n"
               ".safetensors file): layout, config, tensors, parameters, dtypes, bytes, and every\n"
               "problem found. Exit code 3 when there is any problem.",
               table);
    return kExitOk;
  }
  if (parsed.positional.size() != 1) {
    throw ConfigError("inspect takes exactly one PATH, got " + std::to_string(parsed.positional.size()));
  }
  ConfigProblems problems;
  log.validate(problems);
  problems.throw_if_any("inspect");
  init_logging(Topology::single_process(), log.level);

  const auto ck = WanCheckpoint::open(parsed.positional[0], model_config);
  const auto& c = ck.config();
  std::cout << "path:        " << ck.path() << "\n"
            << "format:      " << layout_name(ck.layout())
            << (ck.prefixed() ? " (keys prefixed with model.diffusion_model.)" : "") << "\n"
            << "config:      " << ck.config_path() << "\n"
            << "model:       " << c.summary() << "\n"
            << "files:       " << ck.files().size() << "\n";
  for (const auto& f : ck.files()) {
    std::cout << "  " << f.path() << " (" << f.tensors().size() << " tensors, "
              << format_bytes(static_cast<double>(f.data_bytes())) << ")\n";
  }
  std::cout << "tensors:     " << ck.tensor_count() << " (config expects "
            << wan_param_specs(c).size() << ")\n"
            << "parameters:  " << wan_param_count(c) << "\n"
            << "bytes:       " << ck.total_bytes() << " ("
            << format_bytes(static_cast<double>(ck.total_bytes())) << ")\n"
            << "dtypes:     ";
  for (const auto& [dtype, stat] : ck.dtype_summary()) {
    std::cout << " " << dtype << " x" << stat.first << " ("
              << format_bytes(static_cast<double>(stat.second)) << ")";
  }
  std::cout << "\n";
  const auto list = ck.problems();
  std::cout << "problems:    " << (list.empty() ? "none" : std::to_string(list.size())) << "\n";
  for (const auto& p : list) std::cout << "  - " << p << "\n";
  return list.empty() ? kExitOk : kExitDataError;
}

}  // namespace wd::app
