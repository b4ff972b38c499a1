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
/// first and last samples as read). A cache of whole trajectories (`keep` K > 0, generate --keep)
/// leaves out what only deals them into batches (student.steps, student.expert,
/// train.grad_accum, train.trajectory_rollout): its layout's K says which student.steps read it.
teacher::CacheIdentity cache_identity(const RunConfig& cfg, const WanExperts& teacher, const data::DatasetInfo& data,
                                      std::int64_t keep = 0);

/// The streams of the teacher cache this train reads or writes: one per student rank, or, under
/// student.sequence_parallel N, one per group of N (a group shares its samples: the teacher sends
/// each of its ranks the group's message, so its ranks read one stream).
int cache_streams(const RunConfig& cfg, const comm::Layout& layout);
/// The stream that student world rank `rank` reads (its group's, consecutive student indices).
int cache_stream_of(const TrainJob& job, int rank);

/// data.teacher_cache on this rank, before training: the index read, its identity and layout
/// against `job`'s (cache_streams(job) streams, train.batch_size, the held-out messages), this
/// rank's stream verified (teacher::verify_stream), and rank 0 logs what it covers.
void check_teacher_cache(const TrainJob& job);

/// data.teacher_cache_write, before training: what is not built yet (and what no cache stands
/// for) refused naming the keys on every rank, then world rank 0 claims the folder
/// (teacher::claim_cache_dir: a new cache, or one begun by an earlier run of the same keys and
/// layout, whose complete shards are kept).
void claim_written_cache(const TrainJob& job);

}  // namespace wd::job
