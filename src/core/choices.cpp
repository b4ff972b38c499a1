// The names of the options table's closed choices.
#include "core/choices.hpp"

namespace wd {

const std::vector<std::pair<Precision, const char*>>& choices(Precision) {
  static const std::vector<std::pair<Precision, const char*>> names{{Precision::kFp32, "fp32"},
                                                                     {Precision::kBf16Mixed, "bf16-mixed"}};
  return names;
}

const std::vector<std::pair<ShardMode, const char*>>& choices(ShardMode) {
  static const std::vector<std::pair<ShardMode, const char*>> names{{ShardMode::kNone, "none"},
                                                                     {ShardMode::kOptimizer, "optimizer"},
                                                                     {ShardMode::kGradients, "gradients"},
                                                                     {ShardMode::kParameters, "parameters"}};
  return names;
}

const std::vector<std::pair<Projection, const char*>>& choices(Projection) {
  static const std::vector<std::pair<Projection, const char*>> names{{Projection::kTrained, "trained"},
                                                                      {Projection::kFrozen, "frozen"}};
  return names;
}

const std::vector<std::pair<TeacherPlacement, const char*>>& choices(TeacherPlacement) {
  static const std::vector<std::pair<TeacherPlacement, const char*>> names{
      {TeacherPlacement::kGpu, "gpu"},     {TeacherPlacement::kCpu, "cpu"},
      {TeacherPlacement::kStream, "stream"}, {TeacherPlacement::kShard, "shard"},
      {TeacherPlacement::kColocated, "colocated"}, {TeacherPlacement::kAuto, "auto"}};
  return names;
}

const std::vector<std::pair<TeacherLayout, const char*>>& choices(TeacherLayout) {
  static const std::vector<std::pair<TeacherLayout, const char*>> names{{TeacherLayout::kGiven, "given"},
                                                                        {TeacherLayout::kAuto, "auto"}};
  return names;
}

const std::vector<std::pair<CommMode, const char*>>& choices(CommMode) {
  static const std::vector<std::pair<CommMode, const char*>> names{{CommMode::kScatter, "scatter"},
                                                                    {CommMode::kBroadcast, "broadcast"}};
  return names;
}

const std::vector<std::pair<CriticInit, const char*>>& choices(CriticInit) {
  static const std::vector<std::pair<CriticInit, const char*>> names{
      {CriticInit::kStudent, "student"}, {CriticInit::kTeacher, "teacher"}, {CriticInit::kRandom, "random"}};
  return names;
}

const std::vector<std::pair<DmdStart, const char*>>& choices(DmdStart) {
  static const std::vector<std::pair<DmdStart, const char*>> names{{DmdStart::kSimulate, "simulate"},
                                                                    {DmdStart::kData, "data"}};
  return names;
}

}  // namespace wd
