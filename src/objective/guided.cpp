// train.objective guided: the student matches the teacher's guided velocity, and is sampled without guidance.
#include "objective/builtin.hpp"

namespace wd::objective {

std::unique_ptr<ObjectiveSpec> make_guided() {
  Traits t;
  t.whole_teacher = " runs the conditional and negative forwards of the whole teacher on one rank";
  t.guidance = Guidance::kAlways;
  return std::make_unique<ObjectiveSpec>(
      "guided",
      "the teacher's guided velocity, teacher.guidance: a student sampled without guidance reproduces the guided "
      "teacher",
      t);
}

}  // namespace wd::objective
