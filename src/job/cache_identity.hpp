// A job's teacher-cache identity, and the train side's checks of a cache (data.teacher_cache;
// docs/teacher-cache.md#its-identity).
#pragma once

#include "data/dataset_info.hpp"
#include "job/train_job.hpp"
#include "teacher/teacher_cache.hpp"

namespace wd::job {

/// The identity of the stream of `cfg`'s job with `teacher` and `data` (teacher::CacheIdentity):
/// the keys that decide its batches as the config writes them, the teacher's files' xxh64,
/// teacher.negative's, and the data set's fingerprint (its size and shapes and the xxh64 of its
/// first and last samples as read).
teacher::CacheIdentity cache_identity(const RunConfig& cfg, const WanExperts& teacher, const data::DatasetInfo& data);

/// data.teacher_cache on this rank, before training: the index read, its identity and layout
/// against `job`'s (one stream per student rank, train.batch_size, the held-out messages), this
/// rank's stream verified (teacher::verify_stream), and rank 0 logs what it covers.
void check_teacher_cache(const TrainJob& job);

}  // namespace wd::job
