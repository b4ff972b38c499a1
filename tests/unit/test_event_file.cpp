// TensorBoard event files: CRC-32C test vectors, records byte-equal to TensorBoard's own writer,
// a written file decoded back field by field, and metrics lines mapped to runs and tags.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "metrics/event_file_writer.hpp"
#include "metrics/metrics_writer.hpp"
#include "test_util.hpp"

namespace wd::metrics::test_event_file {
namespace {

namespace fs = std::filesystem;

std::uint32_t crc_of(const std::string& s) { return crc32c(s.data(), s.size()); }

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// --- a reader for the test: TFRecord frames and the few Event fields the writer uses ---------

std::uint64_t little_endian(const std::string& s, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(s.at(at + i));
  return v;
}

/// The payloads of the records in `file`; fails the test on a bad CRC or a truncated record.
std::vector<std::string> records_of(const std::string& file) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < file.size()) {
    const auto length = little_endian(file, at, 8);
    EXPECT_EQ(little_endian(file, at + 8, 4), masked_crc32c(file.data() + at, 8)) << "length CRC at " << at;
    EXPECT_LE(at + 12 + length + 4, file.size()) << "truncated record at " << at;
    if (at + 12 + length + 4 > file.size()) break;
    out.push_back(file.substr(at + 12, length));
    EXPECT_EQ(little_endian(file, at + 12 + length, 4), masked_crc32c(out.back().data(), length))
        << "data CRC at " << at;
    at += 12 + length + 4;
  }
  return out;
}

struct Field {
  std::uint32_t number = 0;
  std::uint32_t wire_type = 0;
  std::uint64_t integer = 0;  ///< varint and fixed-width values
  std::string bytes;          ///< length-delimited values
};

std::uint64_t varint(const std::string& s, std::size_t& at) {
  std::uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const auto byte = static_cast<unsigned char>(s.at(at++));
    v |= static_cast<std::uint64_t>(byte & 0x7F) << shift;
    if (!(byte & 0x80)) return v;
  }
}

std::vector<Field> fields_of(const std::string& message) {
  std::vector<Field> out;
  std::size_t at = 0;
  while (at < message.size()) {
    const auto key = varint(message, at);
    Field f{static_cast<std::uint32_t>(key >> 3), static_cast<std::uint32_t>(key & 7)};
    switch (f.wire_type) {
      case 0: f.integer = varint(message, at); break;
      case 1: f.integer = little_endian(message, at, 8), at += 8; break;
      case 5: f.integer = little_endian(message, at, 4), at += 4; break;
      case 2: {
        const auto n = varint(message, at);
        f.bytes = message.substr(at, n);
        at += n;
        break;
      }
      default: ADD_FAILURE() << "wire type " << f.wire_type; return out;
    }
    out.push_back(f);
  }
  return out;
}

struct DecodedEvent {
  double wall_time = 0;
  std::int64_t step = 0;
  std::string file_version;
  bool session_start = false;
  std::vector<std::pair<std::string, float>> scalars;
};

DecodedEvent decode_event(const std::string& message) {
  DecodedEvent e;
  for (const auto& f : fields_of(message)) {
    if (f.number == 1 && f.wire_type == 1) std::memcpy(&e.wall_time, &f.integer, 8);
    if (f.number == 2 && f.wire_type == 0) e.step = static_cast<std::int64_t>(f.integer);
    if (f.number == 3 && f.wire_type == 2) e.file_version = f.bytes;
    if (f.number == 7 && f.wire_type == 2) {
      for (const auto& s : fields_of(f.bytes)) e.session_start |= s.number == 1 && s.integer == 1;
    }
    if (f.number == 5 && f.wire_type == 2) {
      for (const auto& value : fields_of(f.bytes)) {
        std::pair<std::string, float> scalar;
        for (const auto& v : fields_of(value.bytes)) {
          if (v.number == 1) scalar.first = v.bytes;
          if (v.number == 2 && v.wire_type == 5) {
            const auto bits = static_cast<std::uint32_t>(v.integer);
            std::memcpy(&scalar.second, &bits, 4);
          }
        }
        e.scalars.push_back(scalar);
      }
    }
  }
  return e;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// --- tests -------------------------------------------------------------------------------------

TEST(Crc32c, KnownTestVectors) {
  EXPECT_EQ(crc_of("123456789"), 0xE3069283u);  // the CRC catalogue's check value
  EXPECT_EQ(crc_of(""), 0u);
  // RFC 3720 (iSCSI) appendix B.4.
  EXPECT_EQ(crc_of(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc_of(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string up, down;
  for (int i = 0; i < 32; ++i) {
    up.push_back(static_cast<char>(i));
    down.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crc_of(up), 0x46DD794Eu);
  EXPECT_EQ(crc_of(down), 0x113FDB5Cu);
}

// Golden records: the same events serialized by TensorBoard 2.21's protobuf classes
// (tensorboard.compat.proto.event_pb2) and framed by its RecordWriter
// (tensorboard.summary.writer.record_writer), printed as hex.
TEST(EventEncoding, RecordsAreByteEqualToTensorBoardsOwnWriter) {
  EXPECT_EQ(hex(tfrecord(file_version_event(1234.5))),
            "1800000000000000a37f4b220900000000004a93401a0d627261696e2e4576656e743a3265b8d3fb");
  EXPECT_EQ(hex(tfrecord(session_start_event(1234.5, 7))),
            "0f000000000000006d532b090900000000004a934010073a020801b743e2dd");
  EXPECT_EQ(hex(tfrecord(scalars_event(1234.5, 42, {{"train/loss", 0.25f}, {"memory/rank1/rss_bytes", 0.0f}}))),
            "3f00000000000000516576610900000000004a9340102a2a320a110a0a747261696e2f6c6f7373150000803e0a1d0a16"
            "6d656d6f72792f72616e6b312f7273735f62797465731500000000875aabae");
  // A negative step is a ten-byte varint (int64, not zigzag).
  EXPECT_EQ(hex(tfrecord(scalars_event(1234.5, -1, {{"x", -1.5f}}))),
            "200000000000000029eda9500900000000004a934010ffffffffffffffffff012a0a0a080a0178150000c0bf947c4b33");
}

TEST(EventEncoding, ARecordDecodesBackAndACorruptByteFailsItsCrc) {
  const auto record = tfrecord(scalars_event(1700000000.25, 123456789012LL, {{"eval/rel_mse", 1.2653879f}}));
  const auto payloads = records_of(record);
  ASSERT_EQ(payloads.size(), 1u);
  const auto e = decode_event(payloads[0]);
  EXPECT_EQ(e.wall_time, 1700000000.25);
  EXPECT_EQ(e.step, 123456789012LL);
  ASSERT_EQ(e.scalars.size(), 1u);
  EXPECT_EQ(e.scalars[0].first, "eval/rel_mse");
  EXPECT_EQ(e.scalars[0].second, 1.2653879f);

  auto corrupt = record;
  corrupt[20] ^= 0x01;
  const auto payload = corrupt.substr(12, corrupt.size() - 16);
  EXPECT_NE(little_endian(corrupt, corrupt.size() - 4, 4), masked_crc32c(payload.data(), payload.size()));
}

TEST(EventFileWriter, WritesVersionThenStartThenScalarsReadableWhileOpen) {
  test::TempDir dir("events");
  EventFileWriter writer(dir.str("run"), 5);
  EXPECT_EQ(fs::path(writer.path()).parent_path(), dir.path() / "run");
  EXPECT_NE(fs::path(writer.path()).filename().string().find("events.out.tfevents."), std::string::npos);
  writer.write_scalars(6, {{"train/loss", 2.5f}, {"train/lr", 1e-4f}});
  writer.write_scalars(8, {{"train/loss", 2.25f}});

  // Still open: every record is already in the file.
  const auto payloads = records_of(read_file(writer.path()));
  ASSERT_EQ(payloads.size(), 4u);
  const auto version = decode_event(payloads[0]);
  EXPECT_EQ(version.file_version, "brain.Event:2");
  EXPECT_GT(version.wall_time, 1.7e9);
  const auto start = decode_event(payloads[1]);
  EXPECT_TRUE(start.session_start);
  EXPECT_EQ(start.step, 5);
  const auto first = decode_event(payloads[2]);
  EXPECT_EQ(first.step, 6);
  ASSERT_EQ(first.scalars.size(), 2u);
  EXPECT_EQ(first.scalars[0], std::make_pair(std::string("train/loss"), 2.5f));
  EXPECT_EQ(first.scalars[1], std::make_pair(std::string("train/lr"), 1e-4f));
  EXPECT_GE(first.wall_time, version.wall_time);
  EXPECT_EQ(decode_event(payloads[3]).step, 8);
}

TEST(MetricScalars, StepLinesEvalLinesAndPerRankMemoryLines) {
  const auto train = metric_scalars(nlohmann::json::parse(
      R"({"loss":2.6237093210220337,"lr":0.00036363636363636367,"samples_per_s":49.39,"step":2,"wait_fraction":0.25})"));
  EXPECT_EQ(train.run, "train");
  EXPECT_EQ(train.step, 2);
  ASSERT_EQ(train.scalars.size(), 4u);  // the keys in order; "step" is the step, not a scalar
  EXPECT_EQ(train.scalars[0].tag, "train/loss");
  EXPECT_EQ(train.scalars[0].value, static_cast<float>(2.6237093210220337));
  EXPECT_EQ(train.scalars[1].tag, "train/lr");
  EXPECT_EQ(train.scalars[2].tag, "train/samples_per_s");
  EXPECT_EQ(train.scalars[3].tag, "train/wait_fraction");

  const auto eval = metric_scalars(
      nlohmann::json::parse(R"({"eval_step":10,"rel_mse":1.2653879196345708,"rel_mse_before":1.9598})"));
  EXPECT_EQ(eval.run, "eval");
  EXPECT_EQ(eval.step, 10);
  ASSERT_EQ(eval.scalars.size(), 2u);
  EXPECT_EQ(eval.scalars[0].tag, "eval/rel_mse");
  EXPECT_EQ(eval.scalars[1].tag, "eval/rel_mse_before");

  const auto memory = metric_scalars(nlohmann::json::parse(R"({"memory_step":4,"peaks_since_step":2,"ranks":[
      {"rank":0,"role":"teacher","rss_bytes":212860928,"peak_rss_bytes":213000000,"peak_rss_since_step":2,
       "weights_bytes":0,"grads_bytes":0,"optimizer_state_bytes":0,"device":null},
      {"rank":1,"role":"student","rss_bytes":123456789,"peak_rss_bytes":130000000,"peak_rss_since_step":0,
       "weights_bytes":605184,"grads_bytes":605184,"optimizer_state_bytes":1210368,
       "device":{"allocated_bytes":1024,"total_bytes":150000000000}}]})"));
  EXPECT_EQ(memory.run, "memory");
  EXPECT_EQ(memory.step, 4);
  std::vector<std::string> tags;
  for (const auto& s : memory.scalars) tags.push_back(s.tag);
  EXPECT_EQ(tags, (std::vector<std::string>{
                      "memory/rank0/grads_bytes", "memory/rank0/optimizer_state_bytes", "memory/rank0/peak_rss_bytes",
                      "memory/rank0/rss_bytes", "memory/rank0/weights_bytes", "memory/rank1/device/allocated_bytes",
                      "memory/rank1/device/total_bytes", "memory/rank1/grads_bytes",
                      "memory/rank1/optimizer_state_bytes", "memory/rank1/peak_rss_bytes", "memory/rank1/rss_bytes",
                      "memory/rank1/weights_bytes"}));
  EXPECT_EQ(memory.scalars[10].value, static_cast<float>(123456789.0));  // float32: 123456792

  EXPECT_TRUE(metric_scalars(nlohmann::json::parse(R"({"note":"no step field","x":1})")).run.empty());
}

TEST(MetricsWriter, AppendsJsonLinesAndARunPerKindEachProcessStartingAFileOfItsOwn) {
  test::TempDir dir("metrics");
  const auto jsonl = dir.str("metrics.jsonl");
  {
    MetricsWriter first(jsonl);
    first.append({{"eval_step", 0}, {"rel_mse", 2.0}});
    first.append({{"step", 2}, {"loss", 1.5}, {"lr", 0.1}});
    first.append({{"step", 4}, {"loss", 1.25}, {"lr", 0.2}});
  }
  {
    // A resumed process (from a checkpoint of step 2) writes steps 4 and 6 again, in new files.
    MetricsWriter resumed(jsonl);
    resumed.append({{"eval_step", 2}, {"rel_mse", 1.75}});
    resumed.append({{"step", 4}, {"loss", 1.125}, {"lr", 0.2}});
  }
  MetricsWriter({}).append({{"step", 9}, {"loss", 9.0}});  // no path: writes nothing

  std::ifstream in(jsonl);
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[4]["loss"], 1.125);

  const auto train = event_files(dir.path() / "tensorboard" / "train");
  const auto eval = event_files(dir.path() / "tensorboard" / "eval");
  ASSERT_EQ(train.size(), 2u);
  ASSERT_EQ(eval.size(), 2u);
  EXPECT_EQ(event_files(dir.path() / "tensorboard").size(), 2u) << "one directory per run, nothing else";

  // The resumed file sorts last and starts where the resumed process took over.
  const auto old_train = records_of(read_file(train[0])), new_train = records_of(read_file(train[1]));
  ASSERT_EQ(old_train.size(), 4u);
  EXPECT_EQ(decode_event(old_train[1]).step, 2);
  EXPECT_EQ(decode_event(old_train[3]).scalars.at(0), std::make_pair(std::string("train/loss"), 1.25f));
  ASSERT_EQ(new_train.size(), 3u);
  EXPECT_TRUE(decode_event(new_train[1]).session_start);
  EXPECT_EQ(decode_event(new_train[1]).step, 4);
  EXPECT_EQ(decode_event(new_train[2]).scalars.at(0), std::make_pair(std::string("train/loss"), 1.125f));
  const auto new_eval = records_of(read_file(eval[1]));
  ASSERT_EQ(new_eval.size(), 3u);
  EXPECT_EQ(decode_event(new_eval[1]).step, 2);
}

}  // namespace
}  // namespace wd::metrics::test_event_file
