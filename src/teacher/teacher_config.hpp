// TeacherConfig: the `[teacher]` section.
#pragma once

#include <string>

#include "core/config.hpp"

namespace wd::teacher {

struct TeacherConfig {
  /// Checkpoint directory / .safetensors file, or `builtin:tiny` (generated into the run's cache).
  std::string checkpoint = "builtin:tiny";
  std::string model_config;     ///< config.json override (default: beside the checkpoint)
  std::string dtype = "bf16";   ///< compute / weight dtype: bf16 | fp16 | fp32
  int ranks = 1;                ///< teacher ranks; the other ranks are students

  void bind(OptionTable& t) {
    t.bind("teacher.checkpoint", checkpoint,
           "teacher checkpoint (directory or .safetensors), or builtin:tiny")
        .bind("teacher.model_config", model_config, "config.json override for the checkpoint")
        .bind("teacher.dtype", dtype, "teacher weight and compute dtype: bf16 | fp16 | fp32")
        .bind("teacher.ranks", ranks, "number of teacher ranks (world ranks 0..ranks-1)");
  }
  void validate(ConfigProblems& p) const {
    p.check(dtype == "bf16" || dtype == "fp16" || dtype == "fp32",
            "teacher.dtype(" + dtype + ") must be bf16, fp16 or fp32");
    p.check(ranks >= 1, "teacher.ranks(" + std::to_string(ranks) + ") must be >= 1");
    p.check(!checkpoint.empty(), "teacher.checkpoint must not be empty");
  }
};

}  // namespace wd::teacher
