// train.objective trajectory: the teacher samples from seeded noise; the student learns the jumps
// between its student.steps σ (a few-step student).
#include "objective/builtin.hpp"
#include "teacher/trajectory.hpp"

namespace wd::objective {

namespace {

class Trajectory final : public ObjectiveSpec {
 public:
  Trajectory()
      : ObjectiveSpec("trajectory",
                      "the teacher samples from seeded noise with teacher.steps, teacher.guidance; the student learns "
                      "the jump between its student.steps σ: a few-step student",
                      own_traits()) {}

  void check(const Keys& k, ConfigProblems& p) const override { trajectory_spec(k).validate(p); }
  void check_unused(const Keys& k, const std::string& active, ConfigProblems& p) const override {
    p.check(k.train.trajectory_rollout == 0, "train.trajectory_rollout" + config_value(k.train.trajectory_rollout) +
                                                 " rolls the student out along teacher trajectories: it needs "
                                                 "train.objective trajectory, not " + active);
  }
  bool start_states(const Keys& k) const override { return k.train.trajectory_rollout > 0; }
  /// A roll-out sample at interval i takes i jumps; i is uniform over the k intervals.
  double student_extra_forwards(const Keys& k, double) const override {
    return k.train.trajectory_rollout * static_cast<double>(k.student.steps - 1) / 2.0;
  }

 private:
  static Traits own_traits() {
    Traits t;
    t.whole_teacher = " samples with the whole teacher on one rank";
    t.guidance = Guidance::kUnlessOne;
    t.few_step = true;
    t.trajectories = true;
    return t;
  }
};

}  // namespace

std::unique_ptr<ObjectiveSpec> make_trajectory() { return std::make_unique<Trajectory>(); }

}  // namespace wd::objective
