// The closed choices of the options table: one enum each, with its names (`choices`, found by
// OptionTable::bind), so a name is checked when the options are parsed, --help lists the names
// from these tables, and the code compares values, not strings. Here in core because the
// memory diagnosis, below the student and teacher, reads some of them too.
#pragma once

#include <utility>
#include <vector>

namespace wd {

/// student.precision: fp32 | bf16-mixed (bf16 compute, fp32 master weights and optimizer state).
enum class Precision { kFp32, kBf16Mixed };
const std::vector<std::pair<Precision, const char*>>& choices(Precision);

/// student.shard: what the student group splits between its ranks (ZeRO-1, 2, 3).
enum class ShardMode { kNone, kOptimizer, kGradients, kParameters };
const std::vector<std::pair<ShardMode, const char*>>& choices(ShardMode);

/// student.projection: the channel projections used when in/out channels differ from the teacher's.
enum class Projection { kTrained, kFrozen };
const std::vector<std::pair<Projection, const char*>>& choices(Projection);

/// teacher.placement: where the teacher's weights live and compute runs (auto: chosen at start-up).
enum class TeacherPlacement { kAuto, kGpu, kCpu, kStream, kShard, kColocated };
const std::vector<std::pair<TeacherPlacement, const char*>>& choices(TeacherPlacement);

/// teacher.layout: given (teacher.ranks, placement and stages as set) | auto (timed at start-up).
enum class TeacherLayout { kGiven, kAuto };
const std::vector<std::pair<TeacherLayout, const char*>>& choices(TeacherLayout);

/// comm.mode: scatter (each student its own slice of the batch) | broadcast (all the same batch).
enum class CommMode { kScatter, kBroadcast };
const std::vector<std::pair<CommMode, const char*>>& choices(CommMode);

/// critic.init (dmd): what the critic starts as.
enum class CriticInit { kStudent, kTeacher, kRandom };
const std::vector<std::pair<CriticInit, const char*>>& choices(CriticInit);

/// train.dmd_start: the generator's training sample from its own jumps from noise, or one jump from data.
enum class DmdStart { kSimulate, kData };
const std::vector<std::pair<DmdStart, const char*>>& choices(DmdStart);

/// The samplers' solver (teacher.solver, sample's and evaluate's solvers, the loop's probe): Euler
/// steps | UniPC (bh2, order 2, as the official sampler).
enum class Solver { kUnipc, kEuler };
const std::vector<std::pair<Solver, const char*>>& choices(Solver);

/// A model's dtype as asked (teacher.dtype; sample's, evaluate's and forward's dtype): bf16 | fp16 |
/// fp32 | auto (each tensor as stored).
enum class DtypeChoice { kBf16, kFp16, kFp32, kAuto };
const std::vector<std::pair<DtypeChoice, const char*>>& choices(DtypeChoice);

/// teacher.compute: the teacher's matmul dtype: auto (measured) | weights (teacher.dtype) | fp32.
enum class TeacherCompute { kAuto, kWeights, kFp32 };
const std::vector<std::pair<TeacherCompute, const char*>>& choices(TeacherCompute);

/// comm.backend: how GPU tensors travel between ranks: auto | mpi | nccl (comm/backend_choice.hpp).
enum class CommBackend { kAuto, kMpi, kNccl };
const std::vector<std::pair<CommBackend, const char*>>& choices(CommBackend);

/// student.device: auto (a GPU where there is one) | cpu | cuda.
enum class DeviceChoice { kAuto, kCpu, kCuda };
const std::vector<std::pair<DeviceChoice, const char*>>& choices(DeviceChoice);

/// noise.sampler: how the training σ is drawn: logit-normal | uniform.
enum class NoiseSampler { kLogitNormal, kUniform };
const std::vector<std::pair<NoiseSampler, const char*>>& choices(NoiseSampler);

/// plan --calibrate: time this job's forward and step here: auto (when a batch's forward is
/// estimated under a minute) | yes | no.
enum class Calibrate { kAuto, kYes, kNo };
const std::vector<std::pair<Calibrate, const char*>>& choices(Calibrate);

/// make-dataset --kind: smooth (random smooth latents) | classes (the objectives' bench data).
enum class DatasetKind { kSmooth, kClasses };
const std::vector<std::pair<DatasetKind, const char*>>& choices(DatasetKind);

/// A data set's image condition (/condition, docs/data-format.md) and the kind a teacher takes
/// (make-dataset --image-condition): none | i2v (the first frame's latent followed by zero frames,
/// Wan 2.2 I2V-A14B's y with its mask) | ti2v (the first frame's latent, TI2V-5B's image mode).
enum class ImageCondition { kNone, kI2v, kTi2v };
const std::vector<std::pair<ImageCondition, const char*>>& choices(ImageCondition);

}  // namespace wd
