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

}  // namespace wd
