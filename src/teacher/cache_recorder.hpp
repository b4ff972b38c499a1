// CacheRecorder: a target source that also writes what it makes into a teacher cache, so a train
// streaming to its students leaves the cache a later train reads (data.teacher_cache_write;
// docs/teacher-cache.md#writing-a-cache-while-training).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "teacher/teacher_cache.hpp"

namespace wd::teacher {

/// Wraps one replica's source: every batch `inner` makes is returned unchanged and its students'
/// messages are appended to their streams' shards in the cache at `dir` (claimed before training,
/// claim_cache_dir). The replica serves streams [first_stream, first_stream + slots), slot j's
/// message being samples [j·b, (j+1)·b) of the batch (student_message). A shard complete already
/// (a resumed run's earlier shards, checked against its entry) is kept and not written again; a
/// shard the run enters past its first message (a resume inside it) is first completed from
/// `inner`, which makes any position's batch alike. When the stream's last training shard is in,
/// the index is written if every shard of the cache has its entry (the last recorder to finish
/// writes it).
class CacheRecorder final : public TargetSource {
 public:
  CacheRecorder(std::unique_ptr<TargetSource> inner, std::string dir, int first_stream, int slots,
                std::int64_t batch_per_student);
  ~CacheRecorder() override;
  StageBatch make(std::int64_t position, bool eval) override;

 private:
  /// The shard of (eval, position) of stream first_stream + slot.
  ShardId shard_for(int slot, std::int64_t position, bool eval) const;
  /// Starts the shard of (eval, position): the slots whose shard is not complete yet get a
  /// writer, and messages before `position` are made again.
  void open(std::int64_t position, bool eval);
  /// Appends the batch of the shard's next position to every open writer.
  void append(const StageBatch& made);
  /// Seals the shard's writers, once it holds all its messages.
  void finish();
  /// After the stream's last training shard: the index, once every shard has its entry.
  void write_index_if_last();

  std::unique_ptr<TargetSource> inner_;
  std::string dir_;
  CacheIdentity identity_;
  CacheLayout layout_;
  int first_stream_;
  int slots_;
  std::int64_t batch_per_student_;
  ShardId current_{-1, false, -1, 0};  ///< the shard (of slot 0) being recorded; student -1: none
  std::int64_t rows_ = 0;               ///< its messages made so far
  std::vector<std::unique_ptr<ShardWriter>> writers_;  ///< per slot; null: complete already
};

}  // namespace wd::teacher
