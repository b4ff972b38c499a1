// TensorBoard event files: CRC-32C, TFRecord framing, Event encoding and the appending writer.
#include "metrics/event_file_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/errors.hpp"

namespace wd::metrics {

namespace {

/// The byte-at-a-time table of the reflected Castagnoli polynomial.
std::array<std::uint32_t, 256> make_crc32c_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

// Protocol-buffer wire format: a field key is (number << 3 | wire type); integers are base-128
// varints, least significant group first; fixed-width numbers are little-endian.
enum WireType : std::uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, std::uint32_t field, WireType type) { put_varint(out, field << 3 | type); }

void put_little_endian(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_double(std::string& out, std::uint32_t field, double v) {
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed64);
  put_little_endian(out, bits, 8);
}

void put_float(std::string& out, std::uint32_t field, float v) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed32);
  put_little_endian(out, bits, 4);
}

void put_bytes(std::string& out, std::uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event fields (event.proto). A field at its proto3 default (0, empty) is left out, as protobuf's
// own serializer does: the bytes equal those of TensorBoard's writer.
constexpr std::uint32_t kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5, kSessionLog = 7;
constexpr std::uint32_t kSessionStatus = 1, kSessionStart = 1;        // SessionLog
constexpr std::uint32_t kSummaryValue = 1, kTag = 1, kSimpleValue = 2;  // Summary, Summary.Value

std::string event_header(double wall_time, std::int64_t step) {
  std::string out;
  put_double(out, kWallTime, wall_time);
  if (step != 0) {
    put_key(out, kStep, kVarint);
    put_varint(out, static_cast<std::uint64_t>(step));  // a negative int64 takes ten bytes
  }
  return out;
}

/// write(2) of all of `data`, retried after a signal; false with errno set on failure.
bool write_all(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    const auto n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t size) {
  static const auto table = make_crc32c_table();
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t crc = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

std::uint32_t masked_crc32c(const void* data, std::size_t size) {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

std::string tfrecord(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 16);
  put_little_endian(out, payload.size(), 8);
  put_little_endian(out, masked_crc32c(out.data(), 8), 4);
  out.append(payload);
  put_little_endian(out, masked_crc32c(payload.data(), payload.size()), 4);
  return out;
}

std::string file_version_event(double wall_time) {
  auto out = event_header(wall_time, 0);
  put_bytes(out, kFileVersion, "brain.Event:2");
  return out;
}

std::string session_start_event(double wall_time, std::int64_t step) {
  std::string session_log;
  put_key(session_log, kSessionStatus, kVarint);
  put_varint(session_log, kSessionStart);
  auto out = event_header(wall_time, step);
  put_bytes(out, kSessionLog, session_log);
  return out;
}

std::string scalars_event(double wall_time, std::int64_t step, const std::vector<EventScalar>& scalars) {
  std::string summary;
  for (const auto& s : scalars) {
    std::string value;
    if (!s.tag.empty()) put_bytes(value, kTag, s.tag);
    put_float(value, kSimpleValue, s.value);  // a member of a oneof: written even when 0
    put_bytes(summary, kSummaryValue, value);
  }
  auto out = event_header(wall_time, step);
  put_bytes(out, kSummary, summary);
  return out;
}

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

EventFileWriter::EventFileWriter(const std::string& dir, std::int64_t start_step) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  WD_CHECK_AS(SystemError, !ec, "cannot create the TensorBoard directory " << dir << ": " << ec.message());
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now).count();
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%lld.%06lld", static_cast<long long>(us / 1000000),
                static_cast<long long>(us % 1000000));
  const auto base = (std::filesystem::path(dir) / ("events.out.tfevents." + std::string(stamp) + "." +
                                                   host_name() + "." + std::to_string(::getpid())))
                        .string();
  // A second file of the same run in the same microsecond and process gets a suffix.
  for (int n = 0; fd_ < 0; ++n) {
    path_ = n == 0 ? base : base + "." + std::to_string(n);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0 && (errno != EEXIST || n == 99)) WD_CHECK_SYS(fd_, path_);
  }
  const double wall_time = wall_time_now();
  try {
    write_record(file_version_event(wall_time));
    write_record(session_start_event(wall_time, start_step));
  } catch (...) {
    ::close(std::exchange(fd_, -1));  // no destructor runs for a constructor that throws
    throw;
  }
}

EventFileWriter::~EventFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

EventFileWriter::EventFileWriter(EventFileWriter&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

EventFileWriter& EventFileWriter::operator=(EventFileWriter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

void EventFileWriter::write_scalars(std::int64_t step, const std::vector<EventScalar>& scalars) {
  write_record(scalars_event(wall_time_now(), step, scalars));
}

void EventFileWriter::write_record(const std::string& event) {
  WD_CHECK_AS(SystemError, fd_ >= 0, "event file " << path_ << " is not open");
  if (!write_all(fd_, tfrecord(event))) {
    throw SystemError(detail::located(detail::errno_message("write(" + path_ + ")"), __FILE__, __LINE__));
  }
}

}  // namespace wd::metrics
