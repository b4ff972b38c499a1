// CacheRecorder (cache_recorder.hpp): the source's batches, each also written into the cache.
#include "teacher/cache_recorder.hpp"

#include <spdlog/spdlog.h>

#include "core/errors.hpp"

namespace wd::teacher {

CacheRecorder::CacheRecorder(std::unique_ptr<TargetSource> inner, std::string dir, int first_stream, int slots,
                             std::int64_t batch_per_student)
    : inner_(std::move(inner)),
      dir_(std::move(dir)),
      first_stream_(first_stream),
      slots_(slots),
      batch_per_student_(batch_per_student) {
  std::tie(identity_, layout_) = claimed_cache(dir_);
  WD_CHECK(first_stream_ >= 0 && first_stream_ + slots_ <= layout_.students,
           "teacher cache " << dir_ << ": streams " << first_stream_ << "-" << first_stream_ + slots_ - 1 << " of "
                            << layout_.students);
}

CacheRecorder::~CacheRecorder() = default;

ShardId CacheRecorder::shard_for(int slot, std::int64_t position, bool eval) const {
  const int stream = first_stream_ + slot;
  if (eval) return {stream, true, 0, layout_.eval_messages};
  const auto first = position / layout_.shard_positions * layout_.shard_positions;
  return {stream, false, first, std::min(layout_.shard_positions, layout_.positions - first)};
}

StageBatch CacheRecorder::make(std::int64_t position, bool eval) {
  // Training positions past the cache's (a longer train.steps cannot be claimed) are not recorded.
  if (!eval && position >= layout_.positions) return inner_->make(position, eval);
  const auto id = shard_for(0, position, eval);
  // Opened before this position's batch is made: a resume's earlier messages come first.
  if (current_.student < 0 || current_.eval != id.eval || current_.first != id.first) open(position, eval);
  auto made = inner_->make(position, eval);
  if (!writers_.empty()) {
    WD_CHECK(position == current_.first + rows_, "teacher cache " << dir_ << ": " << current_.file_name()
                                                                  << " expects message " << current_.first + rows_
                                                                  << ", not " << position);
    append(made);
  }
  return made;
}

void CacheRecorder::open(std::int64_t position, bool eval) {
  writers_.clear();  // a shard left unfinished (not reached again) is redone by a later run
  current_ = shard_for(0, position, eval);
  rows_ = 0;
  bool any = false;
  for (int slot = 0; slot < slots_; ++slot) {
    const auto id = shard_for(slot, position, eval);
    if (shard_complete(dir_, id, true)) {
      writers_.push_back(nullptr);
      spdlog::info("data.teacher_cache_write: {} is complete already (a previous run's), kept", id.file_name());
    } else {
      writers_.push_back(std::make_unique<ShardWriter>(dir_, id));
      any = true;
    }
  }
  if (!any) {
    writers_.clear();
    write_index_if_last();  // a run that stopped between its last shard and the index
    return;
  }
  if (position > current_.first) {
    // A run resumed inside the shard: its first messages are made again (a batch is a function
    // of its position), so the shard is whole.
    spdlog::info("data.teacher_cache_write: {} begins at message {}; making messages {}-{} again (a run resumed "
                 "inside it)",
                 current_.file_name(), current_.first, current_.first, position - 1);
    for (std::int64_t p = current_.first; p < position; ++p) append(inner_->make(p, eval));
  }
}

void CacheRecorder::append(const StageBatch& made) {
  check_finite(made.out, current_.first + rows_, "teacher's output");
  for (int slot = 0; slot < slots_; ++slot) {
    auto& w = writers_[static_cast<std::size_t>(slot)];
    if (w) w->add(student_message(made, slot * batch_per_student_, (slot + 1) * batch_per_student_));
  }
  ++rows_;
  if (rows_ == current_.count) finish();
}

void CacheRecorder::finish() {
  for (auto& w : writers_) {
    if (!w) continue;
    const auto hash = w->finish();
    spdlog::info("data.teacher_cache_write: {} written ({} messages, xxh64 {})", w->id().file_name(), w->id().count,
                 hash);
  }
  writers_.clear();
  write_index_if_last();
}

void CacheRecorder::write_index_if_last() {
  const bool last = !current_.eval && current_.first + current_.count == layout_.positions;
  if (last && write_index_if_complete(dir_, identity_, layout_)) {
    spdlog::info("data.teacher_cache_write: the cache {} is complete (index.json written)", dir_);
  }
}

}  // namespace wd::teacher
