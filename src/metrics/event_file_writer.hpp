// TensorBoard event files, written without TensorFlow or protobuf: a TFRecord stream of
// hand-encoded `tensorboard.Event` protocol-buffer messages carrying scalar summaries.
//
// The format, as TensorBoard reads it (tensorboard/compat/proto/event.proto, summary.proto;
// TFRecord as in tensorflow/core/lib/io/record_writer.h):
//   record  = uint64 length (little-endian) | uint32 masked_crc32c(those 8 bytes)
//             | length bytes of data | uint32 masked_crc32c(data)
//   masked_crc32c(x) = rotate_right(crc32c(x), 15) + 0xa282ead8 (mod 2^32), CRC-32C = Castagnoli
//   Event      { double wall_time = 1; int64 step = 2; string file_version = 3;
//                Summary summary = 5; SessionLog session_log = 7; }
//   SessionLog { enum status = 1 (START = 1) }
//   Summary    { repeated Value value = 1 }   Value { string tag = 1; float simple_value = 2 }
// A file starts with an Event holding only file_version "brain.Event:2".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace wd::metrics {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `size` bytes: "123456789" -> 0xE3069283.
std::uint32_t crc32c(const void* data, std::size_t size);

/// The masked CRC-32C that TFRecord stores (so that a CRC of CRCs does not look valid).
std::uint32_t masked_crc32c(const void* data, std::size_t size);

/// `payload` framed as one TFRecord: length, its masked CRC, the payload, its masked CRC.
std::string tfrecord(std::string_view payload);

/// One scalar of a summary: TensorBoard shows one chart per tag.
struct EventScalar {
  std::string tag;
  float value = 0;
};

/// The encoded Event messages this writer produces (protocol-buffer bytes, not yet framed).
std::string file_version_event(double wall_time);
/// SessionLog START at `step`: TensorBoard's Python loader drops whatever an earlier file of the
/// same run recorded at `step` and later (the steps a resumed process writes again).
std::string session_start_event(double wall_time, std::int64_t step);
std::string scalars_event(double wall_time, std::int64_t step, const std::vector<EventScalar>& scalars);

/// Seconds since the Unix epoch, as Event.wall_time holds them.
double wall_time_now();

/// One event file of one TensorBoard run (a directory), open for appending. Every call writes
/// whole records with one write(2), so a reader of the live file sees each event at once (or
/// not yet), never half of one. Move-only; the destructor closes the file and never throws.
class EventFileWriter {
 public:
  /// Creates `dir` (and parents) and a new file events.out.tfevents.<s>.<us>.<host>.<pid> in it:
  /// named by its start time, so a run's files sort in the order their processes started (the
  /// order TensorBoard reads them in). Writes the file_version event, then a SessionLog START at
  /// `start_step`. Throws wd::SystemError when the directory or file cannot be made.
  EventFileWriter(const std::string& dir, std::int64_t start_step);
  ~EventFileWriter();
  EventFileWriter(EventFileWriter&& other) noexcept;
  EventFileWriter& operator=(EventFileWriter&& other) noexcept;
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  /// Appends one event with `scalars` at `step` (wall time now); throws wd::SystemError.
  void write_scalars(std::int64_t step, const std::vector<EventScalar>& scalars);
  /// The file's path.
  const std::string& path() const noexcept { return path_; }

 private:
  void write_record(const std::string& event);

  int fd_ = -1;
  std::string path_;
};

}  // namespace wd::metrics
