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

const std::vector<std::pair<Solver, const char*>>& choices(Solver) {
  static const std::vector<std::pair<Solver, const char*>> names{{Solver::kEuler, "euler"}, {Solver::kUnipc, "unipc"}};
  return names;
}

const std::vector<std::pair<DtypeChoice, const char*>>& choices(DtypeChoice) {
  static const std::vector<std::pair<DtypeChoice, const char*>> names{
      {DtypeChoice::kBf16, "bf16"}, {DtypeChoice::kFp16, "fp16"}, {DtypeChoice::kFp32, "fp32"}, {DtypeChoice::kAuto, "auto"}};
  return names;
}

const std::vector<std::pair<TeacherCompute, const char*>>& choices(TeacherCompute) {
  static const std::vector<std::pair<TeacherCompute, const char*>> names{
      {TeacherCompute::kAuto, "auto"}, {TeacherCompute::kWeights, "weights"}, {TeacherCompute::kFp32, "fp32"}};
  return names;
}

const std::vector<std::pair<CommBackend, const char*>>& choices(CommBackend) {
  static const std::vector<std::pair<CommBackend, const char*>> names{
      {CommBackend::kAuto, "auto"}, {CommBackend::kMpi, "mpi"}, {CommBackend::kNccl, "nccl"}};
  return names;
}

const std::vector<std::pair<DeviceChoice, const char*>>& choices(DeviceChoice) {
  static const std::vector<std::pair<DeviceChoice, const char*>> names{
      {DeviceChoice::kAuto, "auto"}, {DeviceChoice::kCpu, "cpu"}, {DeviceChoice::kCuda, "cuda"}};
  return names;
}

const std::vector<std::pair<NoiseSampler, const char*>>& choices(NoiseSampler) {
  static const std::vector<std::pair<NoiseSampler, const char*>> names{{NoiseSampler::kUniform, "uniform"},
                                                                        {NoiseSampler::kLogitNormal, "logit-normal"}};
  return names;
}

const std::vector<std::pair<Calibrate, const char*>>& choices(Calibrate) {
  static const std::vector<std::pair<Calibrate, const char*>> names{
      {Calibrate::kAuto, "auto"}, {Calibrate::kYes, "yes"}, {Calibrate::kNo, "no"}};
  return names;
}

const std::vector<std::pair<DatasetKind, const char*>>& choices(DatasetKind) {
  static const std::vector<std::pair<DatasetKind, const char*>> names{{DatasetKind::kSmooth, "smooth"},
                                                                       {DatasetKind::kClasses, "classes"}};
  return names;
}

const std::vector<std::pair<ImageCondition, const char*>>& choices(ImageCondition) {
  static const std::vector<std::pair<ImageCondition, const char*>> names{
      {ImageCondition::kNone, "none"}, {ImageCondition::kI2v, "i2v"}, {ImageCondition::kTi2v, "ti2v"}};
  return names;
}

}  // namespace wd
