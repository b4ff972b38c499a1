// wan-distill: entry point; dispatches subcommands and turns errors into one message + exit code.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <iostream>
#include <map>

#include "app/commands.hpp"
#include "core/errors.hpp"
#include "memory/host_memory.hpp"

namespace {

struct Command {
  int (*run)(const std::vector<std::string>&);
  const char* about;
};

const std::map<std::string, Command>& commands() {
  static const std::map<std::string, Command> table{
      {"convert",
       {wd::app::run_convert,
        "rewrite a DiT checkpoint in another dtype (bf16 for teachers) or layout (diffusers)"}},
      {"forward", {wd::app::run_forward, "run the DiT on an inputs file (or random inputs)"}},
      {"init-teacher",
       {wd::app::run_init_teacher,
        "write a randomly initialised DiT in the official or diffusers layout"}},
      {"inspect", {wd::app::run_inspect, "describe and validate a checkpoint"}},
      {"plan", {wd::app::run_plan, "predict each rank's memory per teacher placement (no MPI)"}},
      {"sample",
       {wd::app::run_sample,
        "sample teacher and student from the same noise; error per step and a collapse check"}},
      {"evaluate",
       {wd::app::run_evaluate,
        "score a few-step student against the teacher's rows on held-out noise (report.json)"}},
      {"train", {wd::app::run_train, "distil a teacher into a student (run under mpirun)"}},
      {"generate",
       {wd::app::run_generate,
        "write the teacher's batches of a train's keys into a cache that train reads (run under mpirun)"}},
      {"make-dataset", {wd::app::run_make_dataset, "write a synthetic HDF5 data set"}},
      {"layout", {wd::app::run_layout, "print which rank is teacher/student on which node and GPU"}},
  };
  return table;
}

void print_usage() {
  std::cout << "wan-distill: distil Wan 2.2 DiT teachers into small students across MPI ranks\n\n"
               "usage: wan-distill <command> [options]   (wan-distill <command> --help)\n\n"
               "commands:\n";
  for (const auto& [name, cmd] : commands()) {
    std::printf("  %-14s %s\n", name.c_str(), cmd.about);
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace wd;
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    print_usage();
    return argc < 2 ? kExitUsage : kExitOk;
  }
  const std::string name = argv[1];
  auto it = commands().find(name);
  if (it == commands().end()) {
    std::cerr << "wan-distill: unknown command '" << name << "'\n\n";
    print_usage();
    return kExitUsage;
  }
  // Before any large allocation: freed activations stay mapped for the next step (and plan's
  // timings see the same allocator as train's).
  wd::memory::keep_freed_host_memory();
  const std::vector<std::string> args(argv + 2, argv + argc);
  // One place turns every failure into one clear line and a documented exit code.
  try {
    return it->second.run(args);
  } catch (...) {
    return report_failure(name, std::current_exception());
  }
}
