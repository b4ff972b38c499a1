// A run config as `train` parses a line of words, for the job library's one-process tests.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "job/run_config.hpp"

namespace wd::test {

/// The RunConfig `train` makes of `words` (throws what parsing throws).
inline job::RunConfig run_config(const std::string& words) {
  job::RunConfig cfg;
  OptionTable table("train");
  cfg.bind(table);
  std::vector<std::string> args;
  std::istringstream in(words);
  for (std::string w; in >> w;) args.push_back(w);
  parse_options(args, table);
  return cfg;
}

}  // namespace wd::test
