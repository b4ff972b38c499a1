// Tests of MappedFile and the safetensors reader/writer: every validation rule, round trips,
// zero-copy loading, sharding, atomic writes and the golden wan-tiny-a weights.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/errors.hpp"
#include "model/mapped_file.hpp"
#include "model/safetensors.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;

namespace test_safetensors {
namespace {

using wd::test::contains;

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return tmp_.str(name); }

  std::string write_raw(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }

  /// A file with an explicit header length prefix, header text and `data_bytes` zero bytes.
  std::string craft_with_length(const std::string& name, std::uint64_t length,
                                const std::string& header, std::size_t data_bytes) const {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(length >> (8 * i));
    return write_raw(name, bytes + header + std::string(data_bytes, '\0'));
  }

  std::string craft(const std::string& name, const std::string& header,
                    std::size_t data_bytes) const {
    return craft_with_length(name, header.size(), header, data_bytes);
  }

  /// Opening `file` must throw wd::DataError about `item` whose message names the file and
  /// contains `phrase`.
  void expect_rejected(const std::string& file, const std::string& item,
                       const std::string& phrase) const {
    try {
      wd::SafetensorsFile::open(file);
      ADD_FAILURE() << file << " was accepted; expected an error containing \"" << phrase << "\"";
    } catch (const wd::DataError& e) {
      EXPECT_TRUE(contains(e.what(), file)) << e.what();
      EXPECT_TRUE(contains(e.what(), phrase)) << "missing \"" << phrase << "\" in: " << e.what();
      EXPECT_EQ(e.file(), file);
      EXPECT_EQ(e.item(), item) << e.what();
    }
  }

  wd::test::TempDir tmp_{"wd_st"};
  const fs::path& dir_ = tmp_.path();
};

const std::string kTensorA = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

/// Random bits of the right size for any dtype (bools limited to 0/1), so the round trip
/// covers NaN payloads, denormals and extreme integers alike.
torch::Tensor random_tensor(c10::ScalarType type, at::IntArrayRef shape) {
  if (type == torch::kBool) return torch::randint(0, 2, shape).to(torch::kBool);
  torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(type));
  const torch::Tensor bits = torch::randint(0, 256, {t.numel() * t.element_size()},
                                            torch::TensorOptions().dtype(torch::kByte));
  if (t.numel() > 0) std::memcpy(t.data_ptr(), bits.data_ptr(), bits.numel());
  return t;
}

void expect_bit_equal(const torch::Tensor& expected, const torch::Tensor& actual,
                      const std::string& name) {
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type()) << name;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << name;
  const torch::Tensor e = expected.contiguous();
  const torch::Tensor a = actual.contiguous();
  const std::size_t nbytes = e.numel() * e.element_size();
  if (nbytes > 0) {
    EXPECT_EQ(std::memcmp(e.data_ptr(), a.data_ptr(), nbytes), 0) << name;
  }
}

// --- MappedFile ------------------------------------------------------------------------------

TEST_F(SafetensorsTest, MappedFileMapsContentAndEmptyFile) {
  const auto file = wd::MappedFile::open(write_raw("x.bin", "hello"));
  ASSERT_EQ(file->size(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(file->data()), 5), "hello");
  file->prefetch(0, 5);
  file->prefetch(3, 1000);  // clamped to the file
  file->prefetch(10, 1);    // past the end: ignored

  const auto empty = wd::MappedFile::open(write_raw("empty.bin", ""));
  EXPECT_EQ(empty->size(), 0u);
  EXPECT_EQ(empty->data(), nullptr);
  empty->prefetch(0, 10);

  wd::MappedFile moved(std::move(*wd::MappedFile::open(path("x.bin"))));
  EXPECT_EQ(moved.size(), 5u);
  EXPECT_EQ(moved.data()[4], 'o');
}

TEST_F(SafetensorsTest, MappedFileErrorsNameThePath) {
  try {
    wd::MappedFile::open(path("missing.bin"));
    ADD_FAILURE() << "a missing file was mapped";
  } catch (const wd::SystemError& e) {
    EXPECT_TRUE(contains(e.what(), path("missing.bin"))) << e.what();
  }
  EXPECT_THROW(wd::MappedFile::open(dir_.string()), wd::SystemError);
}

TEST_F(SafetensorsTest, WritesToMappedPagesNeverReachTheFile) {
  const auto file = wd::MappedFile::open(write_raw("x.bin", "hello"));
  file->mutable_data()[0] = 'j';
  EXPECT_EQ(file->data()[0], 'j');
  std::ifstream in(path("x.bin"), std::ios::binary);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "hello");
}

// --- One test per validation rule ------------------------------------------------------------

TEST_F(SafetensorsTest, RejectsFileShorterThanLengthPrefix) {
  expect_rejected(write_raw("short.safetensors", "12345"), "header", "shorter than the 8-byte");
  expect_rejected(write_raw("empty.safetensors", ""), "header", "file is 0 bytes");
}

TEST_F(SafetensorsTest, RejectsHeaderLengthPastEndOfFile) {
  expect_rejected(
      craft_with_length("eof.safetensors", 100, "{}", 8), "header",
      "runs past the end of the file: it needs 8 + 100 = 108 bytes but the file has 18");
}

TEST_F(SafetensorsTest, RejectsHugeHeaderLength) {
  expect_rejected(craft_with_length("huge.safetensors", 100'000'001, "{}", 0), "header",
                  "header length 100000001 exceeds the limit of 100000000 bytes (huge header)");
  expect_rejected(craft_with_length("max.safetensors", ~std::uint64_t{0}, "{}", 0), "header",
                  "huge header");
}

TEST_F(SafetensorsTest, RejectsInvalidJson) {
  expect_rejected(craft("json.safetensors", R"({"a": )", 0), "header", "not valid JSON");
  expect_rejected(craft("utf8.safetensors", "{\"\xff\": 1}", 0), "header", "not valid JSON");
  expect_rejected(craft("zero.safetensors", "", 0), "header", "not valid JSON");
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotAnObject) {
  expect_rejected(craft("array.safetensors", "[1, 2]", 0), "header",
                  "header is a JSON array, not an object");
}

TEST_F(SafetensorsTest, RejectsHeaderNotStartingWithBrace) {
  expect_rejected(craft("space.safetensors", " {}     ", 0), "header", "must start with '{'");
}

TEST_F(SafetensorsTest, RejectsDuplicateKeys) {
  expect_rejected(craft("dup.safetensors", "{" + kTensorA + "," + kTensorA + "}", 8), "a",
                  "duplicate key \"a\"");
  expect_rejected(
      craft("dup-field.safetensors",
            R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
      "a", "duplicate key \"dtype\" in the header (inside the entry \"a\")");
}

TEST_F(SafetensorsTest, RejectsMetadataThatIsNotAnObjectOfStrings) {
  expect_rejected(
      craft("meta-value.safetensors", R"({"__metadata__":{"format":1},)" + kTensorA + "}", 8),
      "__metadata__", "value of \"format\" must be a string, got 1");
  expect_rejected(craft("meta-type.safetensors", R"({"__metadata__":["pt"],)" + kTensorA + "}", 8),
                  "__metadata__", "must be an object of string values, got a JSON array");
}

TEST_F(SafetensorsTest, RejectsMalformedTensorEntries) {
  expect_rejected(craft("entry.safetensors", R"({"a":3})", 0), "a",
                  "tensor entry must be an object");
  expect_rejected(craft("missing.safetensors", R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8),
                  "a", "tensor entry lacks \"shape\"");
  expect_rejected(
      craft("dtype-type.safetensors", R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", 8),
      "a", "\"dtype\" must be a string");
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  expect_rejected(
      craft("dtype.safetensors", R"({"a":{"dtype":"F128","shape":[2],"data_offsets":[0,8]}})", 8),
      "a", "unknown dtype \"F128\"");
}

TEST_F(SafetensorsTest, RejectsNegativeOrNonIntegerShape) {
  expect_rejected(
      craft("neg.safetensors", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
      "a", "shape[0] = -2 is not a non-negative integer");
  expect_rejected(
      craft("frac.safetensors", R"({"a":{"dtype":"F32","shape":[2,1.5],"data_offsets":[0,8]}})", 8),
      "a", "shape[1] = 1.5 is not a non-negative integer");
  expect_rejected(
      craft("shape-type.safetensors", R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8),
      "a", "\"shape\" must be an array of non-negative integers");
}

TEST_F(SafetensorsTest, RejectsDimensionTorchCannotIndex) {
  expect_rejected(
      craft("dim.safetensors",
            R"({"a":{"dtype":"F32","shape":[9223372036854775808,0],"data_offsets":[0,0]}})", 0),
      "a", "exceeds the largest Torch dimension");
}

TEST_F(SafetensorsTest, RejectsMalformedDataOffsets) {
  expect_rejected(
      craft("offsets.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}})", 8),
      "a", "\"data_offsets\" must be [begin, end] with two non-negative integers, got [8]");
  expect_rejected(craft("offsets-neg.safetensors",
                        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8),
                  "a", "\"data_offsets\" must be [begin, end]");
}

TEST_F(SafetensorsTest, RejectsBeginAfterEnd) {
  expect_rejected(
      craft("reversed.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
      "a", "begin 8 is greater than end 0");
}

TEST_F(SafetensorsTest, RejectsShapeSizeMismatch) {
  expect_rejected(
      craft("size.safetensors", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
      "a", "shape [3] of F32 needs 12 bytes but data_offsets [0, 8] span 8 bytes");
}

TEST_F(SafetensorsTest, RejectsOverflowInShapeProduct) {
  expect_rejected(
      craft("elements.safetensors",
            R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})", 0),
      "a", "element count of shape [4294967296,4294967296,0] overflows 64 bits");
  expect_rejected(
      craft("bytes.safetensors",
            R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0),
      "a", "x 8 bytes per F64 overflows 64 bits");
}

TEST_F(SafetensorsTest, RejectsOffsetsOutOfBounds) {
  expect_rejected(
      craft("bounds.safetensors", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
      "a", "data_offsets [0, 16] are out of bounds: the data section holds 8 bytes");
}

TEST_F(SafetensorsTest, RejectsOverlappingTensors) {
  expect_rejected(
      craft("overlap.safetensors",
            "{" + kTensorA + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
      "b", "data_offsets [4, 12] overlap tensor \"a\" at [0, 8]");
}

TEST_F(SafetensorsTest, RejectsGapBetweenTensors) {
  expect_rejected(
      craft("gap.safetensors",
            "{" + kTensorA + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20),
      "b", "leave a gap of 4 bytes after tensor \"a\"");
  expect_rejected(craft("gap-start.safetensors",
                        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                  "a", "leave a gap of 4 bytes after the start of the data section");
}

TEST_F(SafetensorsTest, RejectsTrailingBytes) {
  expect_rejected(craft("trailing.safetensors", "{" + kTensorA + "}", 12), "header",
                  "tensors cover 8 bytes but the data section holds 12 bytes (4 trailing bytes)");
  expect_rejected(craft("no-tensors.safetensors", R"({"__metadata__":{}})", 4), "header",
                  "lists no tensors but the data section holds 4 bytes");
}

TEST_F(SafetensorsTest, RejectsDeeplyNestedHeader) {
  // Regression: a header of a million nested arrays parsed fine, and dumping the entry for the
  // error message then recursed once per level and overflowed the stack.
  const auto nested = [](std::size_t depth) {
    return R"({"a":)" + std::string(depth, '[') + std::string(depth, ']') + "}";
  };
  expect_rejected(craft("deep.safetensors", nested(1'000'000), 0), "header",
                  "header nests deeper than 128 levels");
  expect_rejected(craft("deep-meta.safetensors", R"({"__metadata__":)" + nested(200) + "}", 0),
                  "header", "nests deeper than 128 levels");
  // Within the limit, the entry itself is what is wrong.
  expect_rejected(craft("shallow.safetensors", nested(100), 0), "a",
                  "tensor entry must be an object");
}

TEST_F(SafetensorsTest, EmptyTensorNameIsNamedInErrors) {
  // Found by fuzz_safetensors: safetensors allows "" as a tensor name, and an error about that
  // tensor named no item at all ("file: tensor entry lacks ...").
  expect_rejected(craft("empty-name.safetensors",
                        R"({"":{"dtype":"F32","shap":[4],"data_offsets":[0,16]}})", 16),
                  "\"\"", "tensor entry lacks \"shape\"");
  expect_rejected(craft("empty-dup.safetensors",
                        R"({"":{"dtype":"F32","dtype":"F32","shape":[],"data_offsets":[0,4]}})", 4),
                  "\"\"", "duplicate key \"dtype\" in the header (inside the entry \"\")");
  const auto st = wd::SafetensorsFile::open(
      craft("empty-ok.safetensors", R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4));
  EXPECT_TRUE(st.contains(""));
}

TEST_F(SafetensorsTest, ErrorMessagesQuoteBadValuesShortened) {
  // A hostile header can put megabytes into one value; the message quotes only its start.
  const std::string big(100'000, 'x');
  const auto expect_short = [&](const std::string& name, const std::string& header,
                                const std::string& phrase) {
    try {
      wd::SafetensorsFile::open(craft(name, header, 0));
      ADD_FAILURE() << name << " was accepted";
    } catch (const wd::DataError& e) {
      const std::string msg = e.what();
      EXPECT_LT(msg.size(), 1'000u) << msg.substr(0, 200);
      EXPECT_TRUE(contains(msg, phrase)) << msg.substr(0, 300);
      EXPECT_TRUE(contains(msg, "(100002 chars)") || contains(msg, "(100004 chars)")) << msg;
    }
  };
  expect_short("dtype.safetensors",
               R"({"a":{"dtype":")" + big + R"(","shape":[],"data_offsets":[0,0]}})",
               "unknown dtype \"xxxx");
  expect_short("offsets.safetensors",
               R"({"a":{"dtype":"F32","shape":[],"data_offsets":[")" + big + R"("]}})",
               "\"data_offsets\" must be [begin, end]");
}

TEST_F(SafetensorsTest, ParsesAnInMemoryImageLikeTheFile) {
  // parse_safetensors is what SafetensorsFile::open (and the fuzzer) run over the bytes.
  std::string header = R"({"__metadata__":{"k":"v"},)" + kTensorA +
                       R"(,"b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}})";
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(header.size());
  bytes += header + std::string(12, '\0');
  const auto* data = reinterpret_cast<const std::uint8_t*>(bytes.data());
  const wd::SafetensorsLayout layout = wd::parse_safetensors(data, bytes.size(), "memory");
  EXPECT_EQ(layout.data_start, 8 + header.size());
  EXPECT_EQ(layout.data_bytes, 12u);
  EXPECT_EQ(layout.metadata.at("k"), "v");
  ASSERT_EQ(layout.tensors.size(), 2u);
  EXPECT_EQ(layout.tensors[1].name, "b");
  EXPECT_EQ(layout.tensors[1].shape, (std::vector<std::int64_t>{1, 2}));

  const auto st = wd::SafetensorsFile::open(write_raw("image.safetensors", bytes));
  EXPECT_EQ(st.data_bytes(), layout.data_bytes);
  EXPECT_EQ(st.metadata(), layout.metadata);
  ASSERT_EQ(st.tensors().size(), layout.tensors.size());
  for (std::size_t i = 0; i < layout.tensors.size(); ++i) {
    EXPECT_EQ(st.tensors()[i].name, layout.tensors[i].name);
    EXPECT_EQ(st.tensors()[i].begin, layout.tensors[i].begin);
    EXPECT_EQ(st.tensors()[i].end, layout.tensors[i].end);
  }
  // The name given is what errors carry; the bytes are never read past `size`.
  try {
    wd::parse_safetensors(data, 8 + header.size() + 4, "memory");
    ADD_FAILURE() << "a cut image was accepted";
  } catch (const wd::DataError& e) {
    EXPECT_EQ(e.file(), "memory");
    EXPECT_TRUE(contains(e.what(), "out of bounds: the data section holds 4 bytes")) << e.what();
  }
}

// --- What the rules allow --------------------------------------------------------------------

TEST_F(SafetensorsTest, AcceptsNullMetadataAndZeroSizedTensorsSharingAnOffset) {
  const auto st = wd::SafetensorsFile::open(
      craft("ok.safetensors",
            R"({"__metadata__":null,"e":{"dtype":"I64","shape":[0,3],"data_offsets":[0,0]},)" +
                kTensorA + R"(,"s":{"dtype":"F32","shape":[],"data_offsets":[8,12]}})",
            12));
  EXPECT_TRUE(st.metadata().empty());
  ASSERT_EQ(st.tensors().size(), 3u);
  EXPECT_EQ(st.tensors()[0].name, "e");
  EXPECT_EQ(st.data_bytes(), 12u);
  EXPECT_EQ(st.tensor("e").sizes(), (std::vector<std::int64_t>{0, 3}));
  EXPECT_EQ(st.tensor("s").dim(), 0);
}

TEST_F(SafetensorsTest, DtypesTorchLacksValidateButCannotLoad) {
  const std::string file =
      craft("u16.safetensors", R"({"a":{"dtype":"U16","shape":[4],"data_offsets":[0,8]}})", 8);
  const auto st = wd::SafetensorsFile::open(file);
  EXPECT_EQ(st.info("a").dtype, "U16");
  try {
    st.tensor("a");
    ADD_FAILURE() << "a U16 tensor loaded";
  } catch (const wd::Error& e) {
    EXPECT_TRUE(contains(e.what(), file) && contains(e.what(), "a: dtype U16")) << e.what();
  }
}

TEST_F(SafetensorsTest, UnknownTensorNameIsADataError) {
  const auto st = wd::SafetensorsFile::open(craft("one.safetensors", "{" + kTensorA + "}", 8));
  EXPECT_FALSE(st.contains("b"));
  EXPECT_THROW(st.info("b"), wd::DataError);
  EXPECT_THROW(st.tensor("b"), wd::DataError);
}

TEST_F(SafetensorsTest, MisalignedTensorIsCopiedCorrectly) {
  // A foreign writer put a float at offset 1; Torch gets an aligned copy with the same bits.
  std::string data(5, '\0');
  const float value = 3.25f;
  std::memcpy(&data[1], &value, 4);
  std::string header =
      R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[1,5]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  header.append((8 - header.size() % 8) % 8, ' ');  // the data section starts 8-aligned
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(header.size());
  const auto st = wd::SafetensorsFile::open(write_raw("mis.safetensors", bytes + header + data));
  const torch::Tensor b = st.tensor("b");
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data_ptr()) % 4, 0u);
  EXPECT_EQ(b.item<float>(), value);
}

// --- Writer and reader together --------------------------------------------------------------

TEST_F(SafetensorsTest, RoundTripsEveryTorchDtypeBitExactly) {
  torch::manual_seed(7);
  const std::vector<std::pair<std::string, c10::ScalarType>> dtypes = {
      {"F64", torch::kDouble},    {"F32", torch::kFloat}, {"F16", torch::kHalf},
      {"BF16", torch::kBFloat16}, {"I64", torch::kLong},  {"I32", torch::kInt},
      {"I16", torch::kShort},     {"I8", torch::kChar},   {"U8", torch::kByte},
      {"BOOL", torch::kBool}};
  wd::TensorMap tensors;
  for (const auto& [name, type] : dtypes) {
    EXPECT_EQ(wd::scalar_type_to_safetensors(type), name);
    EXPECT_EQ(wd::safetensors_to_scalar_type(name), type);
    tensors[name] = random_tensor(type, {3, 5});
    tensors[name + ".scalar"] = random_tensor(type, {});
    tensors[name + ".empty"] = random_tensor(type, {2, 0});
  }
  // Non-contiguous input must come back row-major with the same values.
  tensors["F32.transposed"] = torch::randn({4, 3}).t();

  const std::string file = path("all.safetensors");
  wd::write_safetensors(file, tensors);
  const auto st = wd::SafetensorsFile::open(file);
  ASSERT_EQ(st.tensors().size(), tensors.size());
  for (const auto& [name, expected] : tensors) {
    SCOPED_TRACE(name);
    const wd::TensorInfo& info = st.info(name);
    EXPECT_EQ(info.dtype, wd::scalar_type_to_safetensors(expected.scalar_type()));
    EXPECT_EQ(info.nbytes(),
              static_cast<std::uint64_t>(expected.numel() * expected.element_size()));
    expect_bit_equal(expected, st.tensor(name), name);
  }
}

TEST_F(SafetensorsTest, WrittenLayoutIsPaddedAlignedAndSorted) {
  const wd::TensorMap tensors = {{"z.byte", torch::ones({3}, torch::kByte)},
                                 {"a.half", torch::ones({3}, torch::kHalf)},
                                 {"m.double", torch::ones({2}, torch::kDouble)},
                                 {"b.float", torch::ones({1}, torch::kFloat)}};
  const std::string file = path("layout.safetensors");
  wd::write_safetensors(file, tensors, {{"format", "pt"}});
  const auto st = wd::SafetensorsFile::open(file);
  const auto mapped = wd::MappedFile::open(file);
  std::uint64_t header_size = 0;
  std::memcpy(&header_size, mapped->data(), 8);
  EXPECT_EQ(header_size % 8, 0u);
  const std::string header(reinterpret_cast<const char*>(mapped->data()) + 8, header_size);
  EXPECT_LT(header.find("\"__metadata__\""), header.find("\"a.half\""));
  EXPECT_LT(header.find("\"a.half\""), header.find("\"b.float\""));
  EXPECT_LT(header.find("\"m.double\""), header.find("\"z.byte\""));
  for (const wd::TensorInfo& info : st.tensors()) {
    EXPECT_EQ(info.begin % wd::safetensors_dtype_size(info.dtype), 0u) << info.name;
  }
}

TEST_F(SafetensorsTest, MetadataRoundTrips) {
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"note", "quotes \" and\nnewlines and ünïcode"}};
  const std::string file = path("meta.safetensors");
  wd::write_safetensors(file, {{"w", torch::arange(6, torch::kFloat)}}, metadata);
  EXPECT_EQ(wd::SafetensorsFile::open(file).metadata(), metadata);

  wd::write_safetensors(file, {{"w", torch::arange(6, torch::kFloat)}});
  EXPECT_TRUE(wd::SafetensorsFile::open(file).metadata().empty());
}

TEST_F(SafetensorsTest, EmptyTensorMapRoundTrips) {
  const std::string file = path("none.safetensors");
  wd::write_safetensors(file, {});
  const auto st = wd::SafetensorsFile::open(file);
  EXPECT_TRUE(st.tensors().empty());
  EXPECT_EQ(st.data_bytes(), 0u);
}

TEST_F(SafetensorsTest, TensorsAreZeroCopyAndOutliveTheFileObject) {
  const torch::Tensor expected = torch::arange(12, torch::kFloat).reshape({3, 4});
  const std::string file = path("zc.safetensors");
  wd::write_safetensors(file, {{"w", expected}, {"v", torch::ones({2}, torch::kDouble)}});

  torch::Tensor w;
  torch::Tensor same;
  {
    const auto st = wd::SafetensorsFile::open(file);
    w = st.tensor("w");
    const auto* begin = st.mapping().data();
    const auto* p = static_cast<const std::uint8_t*>(w.data_ptr());
    EXPECT_GE(p, begin);
    EXPECT_LE(p + 48, begin + st.mapping().size());
    same = st.tensor("w", torch::kFloat);
    EXPECT_EQ(same.data_ptr(), w.data_ptr());
    const torch::Tensor converted = st.tensor("w", torch::kDouble);
    EXPECT_NE(converted.data_ptr(), w.data_ptr());
    EXPECT_TRUE(torch::equal(converted, expected.to(torch::kDouble)));
    st.prefetch("w");
  }
  // The SafetensorsFile is gone; the tensors' deleters keep the mapping alive.
  EXPECT_TRUE(torch::equal(w, expected));
  EXPECT_TRUE(torch::equal(same + 1, expected + 1));

  // Writing into a mapped tensor changes this process's copy only.
  w.fill_(-1);
  EXPECT_TRUE(torch::equal(wd::SafetensorsFile::open(file).tensor("w"), expected));
}

TEST_F(SafetensorsTest, ShardedWriteProducesShardsAndIndex) {
  wd::TensorMap tensors;
  for (int i = 0; i < 5; ++i)
    tensors["t" + std::to_string(i)] = torch::full({100}, i, torch::kFloat);
  // 400 bytes each, limit 1000: shards of 2, 2 and 1 tensors.
  const auto result =
      wd::write_sharded_safetensors(dir_.string(), "model", tensors, 1000, {{"format", "pt"}});
  const std::vector<std::string> names = {"model-00001-of-00003.safetensors",
                                          "model-00002-of-00003.safetensors",
                                          "model-00003-of-00003.safetensors"};
  EXPECT_EQ(result.shard_files, names);
  EXPECT_EQ(result.index_file, "model.safetensors.index.json");
  EXPECT_EQ(result.total_bytes, 2000u);

  std::ifstream in(path(result.index_file));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(text, "{\n  \"metadata\": {\n    \"total_size\": 2000\n  },")) << text;
  const auto index = nlohmann::json::parse(text);
  EXPECT_EQ(index["metadata"]["total_size"].get<std::uint64_t>(), 2000u);
  const auto& weight_map = index["weight_map"];
  EXPECT_EQ(weight_map.size(), tensors.size());
  for (const auto& [name, expected] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(weight_map.contains(name));
    const auto shard = wd::SafetensorsFile::open(path(weight_map[name].get<std::string>()));
    EXPECT_EQ(shard.metadata().at("format"), "pt");
    EXPECT_TRUE(torch::equal(shard.tensor(name), expected));
  }
  EXPECT_EQ(weight_map["t0"], names[0]);
  EXPECT_EQ(weight_map["t2"], names[1]);
  EXPECT_EQ(weight_map["t4"], names[2]);
}

TEST_F(SafetensorsTest, ShardedWriteThatFitsIsOneFileWithoutIndex) {
  const wd::TensorMap tensors = {{"a", torch::zeros({10})}, {"b", torch::ones({10})}};
  write_raw("model.safetensors.index.json", "{}");  // stale index of an earlier sharded write
  const auto result = wd::write_sharded_safetensors(dir_.string(), "model", tensors, 80);
  EXPECT_EQ(result.shard_files, std::vector<std::string>{"model.safetensors"});
  EXPECT_TRUE(result.index_file.empty());
  EXPECT_EQ(result.total_bytes, 80u);
  EXPECT_FALSE(fs::exists(path("model.safetensors.index.json")));
  EXPECT_EQ(wd::SafetensorsFile::open(path("model.safetensors")).tensors().size(), 2u);
}

TEST_F(SafetensorsTest, AtomicWriteLeavesOnlyTheFinalFile) {
  const std::string file = path("w.safetensors");
  wd::write_safetensors(file, {{"a", torch::ones({4})}});
  wd::write_safetensors(file, {{"b", torch::zeros({2})}});  // replaces the old file
  wd::write_file_atomically(path("note.txt"), "text");
  std::vector<std::string> entries;
  for (const auto& entry : fs::directory_iterator(dir_)) entries.push_back(entry.path().filename());
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"note.txt", "w.safetensors"}));
  EXPECT_TRUE(wd::SafetensorsFile::open(file).contains("b"));
}

TEST_F(SafetensorsTest, FailedWritesThrowAndLeaveNothing) {
  const std::string file = path("missing-dir/w.safetensors");
  try {
    wd::write_safetensors(file, {{"a", torch::ones({4})}});
    ADD_FAILURE() << "wrote into a missing directory";
  } catch (const wd::SystemError& e) {
    EXPECT_TRUE(contains(e.what(), file)) << e.what();
  }
  EXPECT_THROW(
      wd::write_safetensors(path("c.safetensors"), {{"c", torch::ones({2}, torch::kComplexFloat)}}),
      wd::Error);
  EXPECT_THROW(wd::write_safetensors(path("m.safetensors"), {{"__metadata__", torch::ones({2})}}),
               wd::Error);
  EXPECT_TRUE(fs::is_empty(dir_));
}

// --- Golden checkpoint -----------------------------------------------------------------------

TEST(SafetensorsGolden, WanTinyWeightsOpen) {
  const std::string dir = std::string(WD_FIXTURES) + "/wan-tiny-a/";
  const auto fp32 = wd::SafetensorsFile::open(dir + "weights.safetensors");
  const auto bf16 = wd::SafetensorsFile::open(dir + "weights-bf16.safetensors");
  ASSERT_EQ(fp32.tensors().size(), 69u);
  ASSERT_EQ(bf16.tensors().size(), 69u);
  std::uint64_t bytes = 0;
  for (const wd::TensorInfo& info : fp32.tensors()) {
    SCOPED_TRACE(info.name);
    EXPECT_EQ(info.dtype, "F32");
    const torch::Tensor w = fp32.tensor(info.name);
    EXPECT_EQ(w.sizes(), info.shape);
    EXPECT_TRUE(torch::isfinite(w).all().item<bool>());
    const torch::Tensor h = bf16.tensor(info.name);
    EXPECT_EQ(h.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(h, w.to(torch::kBFloat16)));  // round-to-nearest-even, as Torch does
    bytes += info.nbytes();
  }
  EXPECT_EQ(bytes, fp32.data_bytes());
  EXPECT_TRUE(fp32.contains("blocks.0.cross_attn.k.weight"));
}

}  // namespace

}  // namespace test_safetensors
