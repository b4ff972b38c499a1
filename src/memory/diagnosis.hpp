// The failure diagnosis: one text that names the failed rank, its error, every rank's memory
// by category, and remedies computed from the config and the numbers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/checkpoint_policy.hpp"
#include "core/choices.hpp"
#include "core/failure.hpp"
#include "core/topology.hpp"
#include "memory/memory_report.hpp"

namespace wd::memory {

/// One rank as the reporting rank saw it after a failure.
struct RankFailureState {
  int rank = 0;
  Role role = Role::kTeacher;
  bool answered = false;                     ///< false: no report within the deadline
  FailureKind own = FailureKind::kNone;      ///< its own failure; kNone if it only stopped
  std::int64_t step = 0;
  std::string op;
  MemoryReport memory;                       ///< valid when answered
};

/// The settings remedies are computed from, and the command line they adjust.
struct RemedyContext {
  DtypeChoice teacher_dtype = DtypeChoice::kBf16;
  CheckpointPolicy checkpointing;            ///< student.checkpointing
  Precision precision = Precision::kFp32;
  std::int64_t batch_size = 1;
  std::int64_t grad_accum = 1;
  double lr = 1e-4;
  double grad_clip = 0;
  double timeout_s = 120;
  std::string resume_hint;                   ///< e.g. the newest checkpoint; empty when none
  std::vector<std::string> args;             ///< the words after `wan-distill train`
  TeacherPlacement teacher_placement = TeacherPlacement::kCpu;  ///< as resolved (never auto)
  int teacher_ranks = 1;
  int teacher_stages = 1;
  int stream_ahead = 2;
  ShardMode student_shard = ShardMode::kNone;  ///< student.shard
  int student_ranks = 1;
  bool lora_pair = false;                    ///< a LoRA pair: both experts' bases on every student
                                             ///< (false under a colocated teacher, which holds both anyway)
  std::int64_t sequence_parallel = 1;        ///< student.sequence_parallel
  /// Larger student.sequence_parallel sizes this job could take (dividing the student's heads and
  /// each replica's students), smallest first; empty where its samples cannot be split (what
  /// sequence parallelism does not build yet: dmd, colocated, features, LoRA pairs, projections).
  std::vector<std::int64_t> sequence_parallel_sizes;
};

/// Everything the diagnosis reports.
struct DiagnosisInput {
  FailureKind kind = FailureKind::kError;    ///< the primary failure
  int failed_rank = -1;
  Role failed_role = Role::kTeacher;
  std::int64_t step = 0;
  std::string op;
  std::string message;
  std::vector<int> lost;                     ///< ranks that stopped answering
  std::vector<std::string> other_notices;    ///< one line per further notice
  std::vector<RankFailureState> ranks;       ///< index = world rank
  RemedyContext context;
};

/// A remedy: the sentence, and the options it changes (flag without dashes, new value).
struct Remedy {
  std::string text;
  std::vector<std::pair<std::string, std::string>> changes;
};

/// The size of the allocation an out-of-memory message names: LibTorch's CPU allocator ("you
/// tried to allocate 281474976710656 bytes"), its CUDA allocator ("Tried to allocate 20.00 MiB")
/// and the injected fault use these words. nullopt when the message names no size.
std::optional<std::uint64_t> requested_bytes(const std::string& message);

/// Remedies for the primary failure, most effective first, with numbers from the reports.
std::vector<Remedy> compute_remedies(const DiagnosisInput& input);

/// `args` with each change applied (an existing `--key value` / `--key=value` replaced,
/// otherwise appended), as one shell-quoted line starting with "wan-distill train".
std::string adjusted_command(const std::vector<std::string>& args,
                             const std::vector<std::pair<std::string, std::string>>& changes);

/// The whole diagnosis, printed once by the reporting rank.
std::string format_diagnosis(const DiagnosisInput& input);

/// Estimated activation / transient bytes of a report: on a CUDA device the allocator's peak
/// above what is allocated now; on the host the peak RSS above the current RSS (after a failure
/// the step's transients are gone, so the difference is what the step needed on top).
std::uint64_t transient_bytes(const MemoryReport& report);

}  // namespace wd::memory
