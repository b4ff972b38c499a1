// train.objective flow: flow-matching training on the data alone (target ε − x0), no teacher.
#include "objective/builtin.hpp"
#include "teacher/flow_targets.hpp"

namespace wd::objective {

namespace {

class Flow final : public ObjectiveSpec {
 public:
  Flow()
      : ObjectiveSpec("flow", "flow-matching training on the data alone, target noise - x0, no teacher: teacher.ranks 0",
                      own_traits()) {}

  void check(const Keys& k, ConfigProblems& p) const override {
    p.check(k.teacher.ranks == 0, "train.objective flow trains without a teacher: set teacher.ranks 0, not " +
                                      std::to_string(k.teacher.ranks));
    p.check(k.teacher.layout == TeacherLayout::kGiven, "train.objective flow has no teacher to lay out: teacher.layout(" +
                                                           std::string(name_of(k.teacher.layout)) + ") must be given");
    p.check(k.student.features.empty(), "student.features(" + k.student.features +
                                            ") matches teacher blocks; train.objective flow has no teacher");
    p.check(k.student.teacher_blocks().empty(),
            "student.init(" + k.student.init +
                ") copies teacher blocks; train.objective flow has no teacher: random, or weights:PATH to fine-tune a "
                "checkpoint");
  }
  /// The data alone: each batch's target is the velocity of its own noising path.
  std::unique_ptr<teacher::TargetSource> source(const Keys& k, const teacher::SourceParts& parts) const override {
    return std::make_unique<teacher::FlowTargets>(
        teacher::FlowSource{parts.samples, parts.plan, parts.patch, k.train.cond_dropout, k.train.seed});
  }
  void check_unused(const Keys& k, const std::string& active, ConfigProblems& p) const override {
    p.check(k.train.cond_dropout == 0, "train.cond_dropout" + config_value(k.train.cond_dropout) +
                                           " drops contexts of the data: it needs train.objective flow, not " + active);
  }

 private:
  static Traits own_traits() {
    Traits t;
    t.needs_teacher = false;
    return t;
  }
};

}  // namespace

std::unique_ptr<ObjectiveSpec> make_flow() { return std::make_unique<Flow>(); }

}  // namespace wd::objective
