// The objective table and what every spec computes from its traits.
#include "objective/objective_spec.hpp"

#include <algorithm>

#include "objective/builtin.hpp"
#include "teacher/trajectory.hpp"

namespace wd::objective {

namespace {

/// The table: the five built in, then what add() brings. Filled once, before options are parsed.
std::vector<std::unique_ptr<ObjectiveSpec>>& table() {
  static std::vector<std::unique_ptr<ObjectiveSpec>> specs = [] {
    std::vector<std::unique_ptr<ObjectiveSpec>> s;
    s.push_back(make_velocity());
    s.push_back(make_guided());
    s.push_back(make_flow());
    s.push_back(make_trajectory());
    s.push_back(make_dmd());
    return s;
  }();
  return specs;
}

}  // namespace

bool ObjectiveSpec::guided(const Keys& k) const {
  switch (traits_.guidance) {
    case Guidance::kAlways: return true;
    case Guidance::kUnlessOne: return k.teacher.guidance != 1.0;
    case Guidance::kNever: break;
  }
  return false;
}

double ObjectiveSpec::teacher_forwards(const Keys& k) const {
  const double guidance = guided(k) ? 2.0 : 1.0;
  const double per_target =
      !train_targets(k) ? 0.0
      : trajectory_stream(k)
          ? static_cast<double>(k.teacher.steps) / static_cast<double>(std::max<std::int64_t>(1, k.student.steps))
          : 1.0;
  return guidance * (per_target + requests(k));
}

student::TrainConfig ObjectiveSpec::loop_train(const Keys& k) const {
  auto t = k.train;
  if (traits_.few_step) {
    t.sample_steps = k.student.steps;
    t.sample_shift = k.teacher.shift;
    t.sample_solver = Solver::kEuler;
  }
  t.interval_metrics = trajectory_stream(k);
  return t;
}

teacher::TrajectorySpec trajectory_spec(const Keys& k) {
  return {k.teacher.solver, k.teacher.steps, k.student.steps, k.teacher.shift};
}

const ObjectiveSpec& find(const std::string& name) {
  for (const auto& s : table()) {
    if (s->name() == name) return *s;
  }
  std::string list;
  for (const auto& n : names()) list += (list.empty() ? "" : ", ") + n;
  throw ConfigError("train.objective(" + name + ") must be one of " + list);
}

std::vector<std::string> names() {
  std::vector<std::string> out;
  for (const auto& s : table()) out.push_back(s->name());
  return out;
}

void add(std::unique_ptr<ObjectiveSpec> spec) {
  const auto taken = names();
  WD_CHECK_AS(ConfigError, std::find(taken.begin(), taken.end(), spec->name()) == taken.end(),
              "train.objective " << spec->name() << " is in the objective table already");
  table().push_back(std::move(spec));
}

void bind(OptionTable& t, std::string& field) {
  std::string help, listed;
  for (const auto& s : table()) {
    help += (help.empty() ? "" : " | ") + s->name() + " (" + s->summary() + ")";
    listed += (listed.empty() ? "" : " | ") + s->name();
  }
  // find's ConfigError (the name and every name of the table) stops the parse.
  t.bind_parsed<std::string>(
      "train.objective", field, [](const std::string& text) { return find(text).name(); },
      [](const std::string& name) { return name; }, help + "; docs/objectives.md (one of: " + listed + ")");
}

void check(const Keys& k, ConfigProblems& p) {
  const auto& active = find(k.train.objective);
  active.check(k, p);
  for (const auto& s : table()) {
    if (s.get() != &active) s->check_unused(k, active.name(), p);
  }
  if (!active.traits().needs_teacher) return;
  std::string without;
  for (const auto& s : table()) {
    if (!s->traits().needs_teacher) without += (without.empty() ? "" : " or ") + s->name();
  }
  p.check(k.teacher.ranks >= 1, "teacher.ranks(0) means no teacher, which only train.objective " + without +
                                    " trains without; train.objective(" + active.name() + ") needs teacher.ranks >= 1");
}

}  // namespace wd::objective
