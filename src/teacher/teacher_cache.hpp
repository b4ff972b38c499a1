// The teacher cache: what the students of a `train` would receive from their teachers, written
// once by `generate` into checksummed HDF5 shards with an index, and read back by `train
// --data.teacher_cache` as one more target source (docs/teacher-cache.md; the schema is in
// docs/data-format.md#teacher-cache).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "teacher/target_source.hpp"
#include "teacher/trajectory.hpp"

namespace wd::teacher {

/// What decides a cache's batches, key -> value as the config writes it (`teacher.shift` ->
/// "5"), with the derived entries `teacher` (the teacher files' xxh64) and `data` (the data set's
/// fingerprint). A cache is read only by a run whose identity is the same.
using CacheIdentity = std::map<std::string, std::string>;

/// Throws ConfigError naming every key whose value differs between the cache `name` (as the run
/// names it: "data.teacher_cache(DIR)") with identity `cache` and this run (`run`), or that one of
/// them lacks; `what` says what the run is ("this train").
void check_identity(const std::string& name, const CacheIdentity& cache, const CacheIdentity& run,
                    const std::string& what);

/// How the streams of a cache are laid out: one stream per student rank of the train that reads
/// it (each its own replica: the batches a teacher replica serving that student alone would send).
struct CacheLayout {
  int students = 1;                    ///< streams (student ranks of the reading train)
  std::int64_t batch = 1;              ///< samples per message (train.batch_size)
  std::int64_t eval_messages = 0;      ///< held-out messages per stream
  std::int64_t positions = 0;          ///< training messages per stream (train.steps · train.grad_accum)
  std::int64_t shard_positions = 64;   ///< messages per shard (the last of a stream may hold fewer)
  /// The teacher replicas whose batches the streams are slices of: 0, one replica per stream
  /// (generate's, a colocated train's, a train with as many teacher replicas as students); R > 0,
  /// a train whose R replicas each served students/R consecutive streams
  /// (data.teacher_cache_write), which deals a replica's samples otherwise.
  int replicas = 0;
  /// 0: the streams hold messages (the batches themselves). K > 0 (`generate --keep`): they hold
  /// trajectory rounds, each the round's B whole trajectories at K + 1 points of the teacher's σ
  /// grid (StoredTrajectories), which students of any student.steps dividing K deal into their
  /// own batches; eval_messages, positions and shard_positions then count rounds.
  std::int64_t keep = 0;

  bool operator==(const CacheLayout& o) const {
    return students == o.students && batch == o.batch && eval_messages == o.eval_messages &&
           positions == o.positions && shard_positions == o.shard_positions && replicas == o.replicas &&
           keep == o.keep;
  }
};

/// One shard: messages [first, first + count) of stream `student`'s training (or held-out) messages.
struct ShardId {
  int student = 0;
  bool eval = false;
  std::int64_t first = 0;
  std::int64_t count = 0;
  /// "s00000-train-000000064.h5" (stream, kind, first position).
  std::string file_name() const;
};

/// Every shard of `layout`, in one fixed order: by stream, its held-out shard first, then its
/// training shards by position. Shard i of a generate job on G ranks is written by rank i mod G.
std::vector<ShardId> cache_shards(const CacheLayout& layout);

/// The shards rank `rank` of a generate job on `ranks` ranks writes, in cache_shards' order:
/// shard i on rank i mod ranks.
std::vector<ShardId> shards_of_rank(const CacheLayout& layout, int rank, int ranks);

/// One shard being written, a message at a time: into a temporary file (any stale entry of the
/// shard removed first), then, at finish(), each message's xxh64 added, the file fsynced and
/// renamed into place, and its entry (the file's xxh64) written the same way. A shard is either
/// complete with its entry or redone: one dropped before finish() removes its temporary file.
class ShardWriter {
 public:
  ShardWriter(std::string dir, ShardId id);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  /// Appends the shard's next message (a student message: its tensors on any device).
  void add(const comm::TensorDict& message);
  std::int64_t rows() const { return static_cast<std::int64_t>(hashes_.size()); }
  bool full() const { return rows() == id_.count; }
  const ShardId& id() const { return id_; }
  /// Seals a full shard (above) and returns the file's xxh64.
  std::string finish();

 private:
  std::string dir_;
  ShardId id_;
  std::string tmp_;
  struct OpenFile;                  ///< the temporary HDF5 file; null once finished
  std::unique_ptr<OpenFile> file_;
  std::vector<std::string> names_;
  std::vector<std::uint64_t> hashes_;
};

/// Writes shard `id` of the cache at `dir` with a ShardWriter: the messages `source` makes at its
/// positions (each `batch` samples, the student message of student_message). Returns the file's
/// xxh64.
std::string write_shard(const std::string& dir, const ShardId& id, TargetSource& source, std::int64_t batch);

/// Writes shard `id` of a cache of trajectories (CacheLayout::keep `keep`) at `dir` with a
/// ShardWriter: the rounds `rounds` samples at its positions, each a message {"states":
/// whole_round(...)}. Returns the file's xxh64.
std::string write_trajectory_shard(const std::string& dir, const ShardId& id, TrajectoryRounds& rounds,
                                   std::int64_t keep);

/// Whether shard `id` of the cache at `dir` is complete: its entry is there, and (when `rehash`)
/// the file's xxh64 is the entry's.
bool shard_complete(const std::string& dir, const ShardId& id, bool rehash);

/// The start of a generate job (or a train with data.teacher_cache_write) at `dir`: creates it and
/// writes its identity and layout (identity.json), or, resuming, checks them against the ones
/// there (check_identity; a layout that differs is named too). `name` is the folder as the job
/// names it, `what` the job, in the errors (generate's: "generate --output DIR", "this generate").
void claim_cache_dir(const std::string& dir, const CacheIdentity& identity, const CacheLayout& layout,
                     const std::string& name = "", const std::string& what = "this generate");

/// The identity and layout claim_cache_dir wrote at `dir`.
std::pair<CacheIdentity, CacheLayout> claimed_cache(const std::string& dir);

/// A complete cache: its identity, layout and shards with their files' xxh64.
struct CacheIndex {
  CacheIdentity identity;
  CacheLayout layout;
  std::vector<ShardId> shards;
  std::vector<std::string> xxh64;    ///< shards[i]'s file
  std::vector<std::string> tensors;  ///< the message's tensors, one dataset each
};

/// Writes index.json once every shard of `layout` has its entry (the cache is complete), and
/// returns true; false (nothing written) while some shard is missing.
bool write_index_if_complete(const std::string& dir, const CacheIdentity& identity, const CacheLayout& layout);

/// The index of the cache at `dir`; DataError naming the file when it is missing (generate has
/// not finished: rerun it to resume) or malformed.
CacheIndex read_cache_index(const std::string& dir);

/// Checks every shard of stream `student`: the file's xxh64 against the index, then each
/// message against its own xxh64. DataError naming the file, the dataset and the message
/// (stream position) of the first problem: a truncated, altered or missing shard stops the run
/// before training.
void verify_stream(const std::string& dir, const CacheIndex& index, int student);

/// One stream of a cache, row by row (a message, or a trajectory round): row `position` of the
/// training (or held-out) rows, read from its shard, which stays open for the next. Training
/// positions past the cache's end read it again from the start (position mod positions), with
/// one log line when that begins, or, when not `cycle` (data.teacher_cache_end stop, which the
/// train refused before training for a train.steps past the end), are an error.
class StreamRows {
 public:
  StreamRows(std::string dir, CacheIndex index, int student, bool cycle);
  ~StreamRows();
  comm::TensorDict read(std::int64_t position, bool eval);
  const CacheIndex& index() const { return index_; }

 private:
  std::string dir_;
  CacheIndex index_;
  int student_;
  bool cycle_;
  bool cycling_logged_ = false;
  struct OpenShard;                  ///< the shard read last, kept open for the next row
  std::unique_ptr<OpenShard> open_;
};

/// The batches of one stream of a cache of messages (the student's replica): message `position`.
class CacheSource final : public TargetSource {
 public:
  CacheSource(std::string dir, CacheIndex index, int student, bool cycle)
      : rows_(std::move(dir), std::move(index), student, cycle) {}
  StageBatch make(std::int64_t position, bool eval) override;

 private:
  StreamRows rows_;
};

/// The trajectories of one stream of a cache of trajectories (CacheLayout::keep > 0): round
/// `round`'s states, which a TrajectoryRounds of the stream's replica deals into its batches.
class CachedTrajectories final : public StoredTrajectories {
 public:
  CachedTrajectories(std::string dir, CacheIndex index, int student, bool cycle)
      : rows_(std::move(dir), std::move(index), student, cycle) {}
  std::int64_t intervals() const override { return rows_.index().layout.keep; }
  torch::Tensor round(std::int64_t round, bool eval) override { return rows_.read(round, eval).at("states"); }

 private:
  StreamRows rows_;
};

}  // namespace wd::teacher
