// `wan-distill inspect`: describes a checkpoint (or both experts of an A14B folder) and lists
// every problem found in it.
#include <filesystem>
#include <iostream>
#include <sstream>

#include "app/commands.hpp"
#include "core/logging.hpp"
#include "model/wan_checkpoint.hpp"
#include "model/wan_experts.hpp"

namespace wd::app {

namespace fs = std::filesystem;

namespace {

/// Prints one checkpoint's report, each line led by `indent`; returns its problem count.
std::size_t print_checkpoint(const WanCheckpoint& ck, const std::string& indent) {
  std::ostringstream os;
  const auto& c = ck.config();
  if (const auto* lora = ck.lora()) {
    std::int64_t adapters = 0;
    for (const auto& [linear, pair] : lora->adapters) adapters += pair.first.numel() + pair.second.numel();
    os << "lora:        " << lora->dir << ": rank " << lora->spec.rank << ", alpha " << lora->spec.alpha << ", "
       << lora->spec.targets.size() << " linears, " << adapters
       << " adapter parameters; the tensors below are its base's, read with the adapters merged\n";
  }
  os << "path:        " << ck.path() << "\n"
     << "format:      " << layout_name(ck.layout())
     << (ck.prefixed() ? " (keys prefixed with model.diffusion_model.)" : "") << "\n"
     << "config:      " << ck.config_path() << "\n"
     << "model:       " << c.summary() << "\n"
     << "files:       " << ck.files().size() << "\n";
  for (const auto& f : ck.files()) {
    os << "  " << f.path() << " (" << f.tensors().size() << " tensors, "
       << format_bytes(static_cast<double>(f.data_bytes())) << ")\n";
  }
  os << "tensors:     " << ck.tensor_count() << " (config expects "
     << wan_param_specs(c).size() << ")\n"
     << "parameters:  " << wan_param_count(c) << "\n"
     << "bytes:       " << ck.total_bytes() << " ("
     << format_bytes(static_cast<double>(ck.total_bytes())) << ")\n"
     << "dtypes:     ";
  for (const auto& [dtype, stat] : ck.dtype_summary()) {
    os << " " << dtype << " x" << stat.first << " ("
       << format_bytes(static_cast<double>(stat.second)) << ")";
  }
  os << "\n";
  const auto list = ck.problems();
  os << "problems:    " << (list.empty() ? "none" : std::to_string(list.size())) << "\n";
  for (const auto& p : list) os << "  - " << p << "\n";
  std::istringstream lines(os.str());
  for (std::string line; std::getline(lines, line);) std::cout << indent << line << "\n";
  return list.size();
}

}  // namespace

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
               "problem found. A diffusers pipeline folder is read through its transformer/. A\n"
               "two-expert (A14B) folder, official (low_noise_model/, high_noise_model/) or a\n"
               "diffusers pipeline (transformer_2/ low-noise, transformer/ high-noise,\n"
               "boundary_ratio in model_index.json), gets both experts' reports and a check that\n"
               "they share one architecture. Exit code 3 when there is any problem.",
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

  const auto& path = parsed.positional[0];
  const auto folders = WanExperts::folders(path);
  if (!folders) {
    const auto found = print_checkpoint(WanCheckpoint::open(path, model_config), "");
    return found == 0 ? kExitOk : kExitDataError;
  }
  // A two-expert (A14B) folder, official or diffusers pipeline: each expert's report, then
  // whether they share one architecture.
  if (!model_config.empty()) {
    throw ConfigError("--model-config cannot be used with the two-expert folder " + path +
                      ": each expert has its own config.json");
  }
  const auto& [low, high] = folders->names;
  const fs::path dir(path);
  std::vector<WanCheckpoint> experts;
  for (const auto& sub : folders->names) {
    if (!fs::is_directory(dir / sub)) {
      throw DataError(path, sub, "is missing: a two-expert checkpoint needs " + low + "/ and " +
                                     high + "/");
    }
    experts.push_back(WanCheckpoint::open((dir / sub).string()));
  }
  const auto& type = experts[0].config().model_type;
  const auto boundary = folders->boundary ? folders->boundary : default_expert_boundary(type);
  std::cout << "path:        " << path << "\n"
            << "experts:     2 (" << low << ", " << high
            << "), high-noise expert for t >= boundary*1000, boundary ";
  if (folders->boundary) {
    std::cout << *boundary << " (boundary_ratio of model_index.json)\n";
  } else if (boundary) {
    std::cout << *boundary << " (default of " << type << ")\n";
  } else {
    std::cout << "not set (model_type " << type << " has no default)\n";
  }
  std::size_t problems_found = 0;
  for (std::size_t i = 0; i < experts.size(); ++i) {
    std::cout << folders->names[i] << (i == 0 ? " (low-noise)" : " (high-noise)") << ":\n";
    problems_found += print_checkpoint(experts[i], "  ");
  }
  try {
    check_same_architecture(experts[0].config(), experts[0].config_path(), experts[1].config(),
                            experts[1].config_path());
    std::cout << "architecture: shared\n";
  } catch (const DataError& e) {
    std::cout << "architecture: " << e.what() << "\n";
    ++problems_found;
  }
  return problems_found == 0 ? kExitOk : kExitDataError;
}

}  // namespace wd::app
