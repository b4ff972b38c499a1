// wan-distill: entry point; dispatches subcommands and turns errors into one message + exit code.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <new>

#include "app/commands.hpp"
#include "core/errors.hpp"

namespace {

struct Command {
  int (*run)(const std::vector<std::string>&);
  const char* about;
};

const std::map<std::string, Command>& commands() {
  static const std::map<std::string, Command> table{
      {"forward", {wd::app::run_forward, "run the DiT on an inputs file (or random inputs)"}},
      {"init-teacher",
       {wd::app::run_init_teacher, "write a randomly initialised DiT in the official layout"}},
      {"inspect", {wd::app::run_inspect, "describe and validate a checkpoint"}},
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
  using namespace wd::app;
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
  const std::vector<std::string> args(argv + 2, argv + argc);
  // One place turns every failure into one clear line and a documented exit code.
  try {
    return it->second.run(args);
  } catch (const wd::ConfigError& e) {
    spdlog::error("{}: {}", name, e.what());
    std::cerr << "(see: wan-distill " << name << " --help)\n";
    return kExitUsage;
  } catch (const wd::DataError& e) {
    spdlog::error("{}: bad input: {}", name, e.what());
    return kExitDataError;
  } catch (const wd::Error& e) {
    spdlog::error("{}: {}", name, e.what());
    return kExitError;
  } catch (const std::bad_alloc&) {
    spdlog::error("{}: out of host memory", name);
    return kExitError;
  } catch (const c10::Error& e) {
    spdlog::error("{}: LibTorch error: {}", name, e.what_without_backtrace());
    return kExitError;
  } catch (const std::exception& e) {
    spdlog::error("{}: {}", name, e.what());
    return kExitError;
  }
}
