// train.objective velocity: the student matches the teacher's velocity at noised data.
#include "objective/builtin.hpp"

namespace wd::objective {

std::unique_ptr<ObjectiveSpec> make_velocity() {
  Traits t;
  t.no_lora_student = "a LoRA student starts as the teacher, whose velocity is the target, so there is nothing to "
                      "learn; use guided, trajectory or dmd (docs/lora.md)";
  return std::make_unique<ObjectiveSpec>("velocity", "the student matches the teacher's velocity at noised data", t);
}

}  // namespace wd::objective
