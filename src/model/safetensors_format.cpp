// safetensors header validation over a byte buffer; deliberately free of Torch so the fuzzer
// builds it alone with clang.
#include "model/safetensors_format.hpp"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "core/errors.hpp"

namespace wd {
namespace {

using json = nlohmann::json;

struct DtypeSize {
  const char* name;
  std::size_t size;
};

// The dtypes of safetensors 0.4/0.5 (0.6 added sub-byte, E8M0 and complex types, which no Wan
// checkpoint uses). safetensors.cpp maps the ones Torch 1.13 has to scalar types.
const DtypeSize kDtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
    {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8},
};

std::string known_dtypes() {
  std::string names;
  for (const DtypeSize& spec : kDtypes) {
    names += names.empty() ? "" : ", ";
    names += spec.name;
  }
  return names;
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

/// The item a tensor's errors name: its name, or `""` for the empty name safetensors allows
/// (an empty item would vanish from the message).
std::string tensor_item(const std::string& name) { return name.empty() ? "\"\"" : name; }

std::string offsets_string(const TensorInfo& t) {
  return "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
}

/// A JSON value for an error message, cut short: a hostile header can hold megabytes in one
/// entry, and the message only needs enough to recognise it.
std::string excerpt(const json& value) {
  constexpr std::size_t kMax = 80;
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > kMax) {
    text = text.substr(0, kMax) + "... (" + std::to_string(text.size()) + " chars)";
  }
  return text;
}

std::uint64_t read_le64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

/// Parses the header, rejecting duplicate keys at any depth (nlohmann::json would silently
/// keep one of them, while safetensors refuses the file) and nesting deeper than safetensors
/// accepts (deep values would also make dumping one for a message recurse without bound).
json parse_header(const std::string& file, const char* begin, const char* end) {
  struct Frame {
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<Frame> frames;
  const json::parser_callback_t track_keys = [&](int depth, json::parse_event_t event,
                                                 json& parsed) {
    WD_CHECK_DATA(depth <= kSafetensorsMaxHeaderDepth, file, "header",
                  "header nests deeper than " << kSafetensorsMaxHeaderDepth << " levels");
    switch (event) {
      case json::parse_event_t::object_start:
        frames.emplace_back();
        break;
      case json::parse_event_t::object_end:
        frames.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!frames.back().keys.insert(key).second) {
          // Below the top level the key belongs to the entry named by the top-level key.
          const bool top = frames.size() == 1;
          const std::string& entry = top ? key : frames.front().last_key;
          throw DataError(file, tensor_item(entry),
                          "duplicate key \"" + key + "\" in the header" +
                              (top ? std::string() : " (inside the entry \"" + entry + "\")"));
        }
        frames.back().last_key = key;
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(begin, end, track_keys);
  } catch (const json::exception& e) {
    throw DataError(file, "header", std::string("header is not valid JSON: ") + e.what());
  }
}

std::map<std::string, std::string> parse_metadata(const std::string& file, const json& value) {
  std::map<std::string, std::string> metadata;
  // safetensors reads `__metadata__` as an optional map, so an explicit null means "none".
  if (value.is_null()) return metadata;
  WD_CHECK_DATA(
      value.is_object(), file, "__metadata__",
      "__metadata__ must be an object of string values, got a JSON " << value.type_name());
  for (const auto& [key, v] : value.items()) {
    WD_CHECK_DATA(v.is_string(), file, "__metadata__",
                  "__metadata__ value of \"" << key << "\" must be a string, got " << excerpt(v));
    metadata.emplace(key, v.get<std::string>());
  }
  return metadata;
}

TensorInfo parse_entry(const std::string& file, const std::string& name, const json& entry,
                       std::uint64_t data_size) {
  const std::string item = tensor_item(name);
  WD_CHECK_DATA(
      entry.is_object(), file, item,
      "tensor entry must be an object with \"dtype\", \"shape\" and \"data_offsets\", got "
          << excerpt(entry));
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    WD_CHECK_DATA(entry.contains(field), file, item, "tensor entry lacks \"" << field << "\"");
  }
  TensorInfo info;
  info.name = name;

  const json& dtype = entry.at("dtype");
  WD_CHECK_DATA(dtype.is_string(), file, item,
                "\"dtype\" must be a string, got " << excerpt(dtype));
  info.dtype = dtype.get<std::string>();
  const std::size_t element_size = safetensors_dtype_size(info.dtype);
  WD_CHECK_DATA(element_size != 0, file, item,
                "unknown dtype " << excerpt(dtype) << " (known: " << known_dtypes() << ")");

  const json& shape = entry.at("shape");
  WD_CHECK_DATA(shape.is_array(), file, item,
                "\"shape\" must be an array of non-negative integers, got " << excerpt(shape));
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const json& dim = shape[i];
    WD_CHECK_DATA(dim.is_number_unsigned(), file, item,
                  "shape[" << i << "] = " << excerpt(dim) << " is not a non-negative integer");
    const auto value = dim.get<std::uint64_t>();
    // safetensors allows any usize; Torch sizes are int64, so larger dimensions cannot load.
    WD_CHECK_DATA(
        value <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), file,
        item,
        "shape[" << i << "] = " << value << " exceeds the largest Torch dimension 2^63-1");
    info.shape.push_back(static_cast<std::int64_t>(value));
  }

  const json& offsets = entry.at("data_offsets");
  WD_CHECK_DATA(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                    offsets[1].is_number_unsigned(),
                file, item,
                "\"data_offsets\" must be [begin, end] with two non-negative integers, got "
                    << excerpt(offsets));
  info.begin = offsets[0].get<std::uint64_t>();
  info.end = offsets[1].get<std::uint64_t>();
  WD_CHECK_DATA(info.begin <= info.end, file, item,
                "data_offsets " << offsets_string(info) << " are reversed: begin " << info.begin
                                << " is greater than end " << info.end);

  // The product is taken in header order with overflow checks, as safetensors does, so a
  // crafted shape cannot wrap around to a small, matching byte count.
  std::uint64_t elements = 1;
  for (const std::int64_t dim : info.shape) {
    WD_CHECK_DATA(!__builtin_mul_overflow(elements, static_cast<std::uint64_t>(dim), &elements),
                  file, item,
                  "element count of shape " << shape_string(info.shape) << " overflows 64 bits");
  }
  std::uint64_t bytes = 0;
  WD_CHECK_DATA(!__builtin_mul_overflow(elements, element_size, &bytes), file, item,
                "byte size of shape " << shape_string(info.shape) << " (" << elements
                                      << " elements) x " << element_size << " bytes per "
                                      << info.dtype << " overflows 64 bits");
  WD_CHECK_DATA(bytes == info.nbytes(), file, item,
                "shape " << shape_string(info.shape) << " of " << info.dtype << " needs " << bytes
                         << " bytes but data_offsets " << offsets_string(info) << " span "
                         << info.nbytes() << " bytes");
  WD_CHECK_DATA(info.end <= data_size, file, item,
                "data_offsets " << offsets_string(info)
                                << " are out of bounds: the data section holds " << data_size
                                << " bytes");
  return info;
}

/// Sorts by offset and checks the tensors tile the data section: from 0, no overlap, no gap,
/// no trailing bytes.
void check_layout(const std::string& file, std::vector<TensorInfo>& tensors,
                  std::uint64_t data_size) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  std::uint64_t covered = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : tensors) {
    // `covered` is 0 until a tensor is seen, so `previous` is set whenever this check fails.
    WD_CHECK_DATA(t.begin >= covered, file, tensor_item(t.name),
                  "data_offsets " << offsets_string(t) << " overlap tensor \"" << previous->name
                                  << "\" at " << offsets_string(*previous));
    WD_CHECK_DATA(t.begin == covered, file, tensor_item(t.name),
                  "data_offsets " << offsets_string(t) << " leave a gap of " << t.begin - covered
                                  << " bytes after "
                                  << (previous ? "tensor \"" + previous->name + "\" at " +
                                                     offsets_string(*previous)
                                               : std::string("the start of the data section")));
    covered = t.end;
    previous = &t;
  }
  WD_CHECK_DATA(!(tensors.empty() && data_size > 0), file, "header",
                "the header lists no tensors but the data section holds "
                    << data_size << " bytes (trailing bytes)");
  WD_CHECK_DATA(covered == data_size, file, "header",
                "tensors cover " << covered << " bytes but the data section holds " << data_size
                                 << " bytes (" << data_size - covered << " trailing bytes)");
}

}  // namespace

std::size_t safetensors_dtype_size(const std::string& dtype) {
  for (const DtypeSize& spec : kDtypes) {
    if (dtype == spec.name) return spec.size;
  }
  return 0;
}

SafetensorsLayout parse_safetensors(const std::uint8_t* data, std::size_t size,
                                    const std::string& file) {
  const std::uint64_t file_size = size;
  WD_CHECK_DATA(file_size >= 8, file, "header",
                "file is " << file_size
                           << " bytes, shorter than the 8-byte header length that starts every "
                              "safetensors file");
  const std::uint64_t header_size = read_le64(data);
  WD_CHECK_DATA(header_size <= kSafetensorsMaxHeaderBytes, file, "header",
                "header length " << header_size << " exceeds the limit of "
                                 << kSafetensorsMaxHeaderBytes << " bytes (huge header)");
  WD_CHECK_DATA(header_size <= file_size - 8, file, "header",
                "header length " << header_size << " runs past the end of the file: it needs 8 + "
                                 << header_size << " = " << 8 + header_size
                                 << " bytes but the file has " << file_size);

  const char* text = reinterpret_cast<const char*>(data + 8);
  const json header = parse_header(file, text, text + header_size);
  WD_CHECK_DATA(header.is_object(), file, "header",
                "header is a JSON " << header.type_name() << ", not an object");
  // A JSON object is at least "{}", so text[0] lies inside the header here.
  WD_CHECK_DATA(text[0] == '{', file, "header",
                "header must start with '{' (safetensors refuses leading whitespace)");

  SafetensorsLayout layout;
  layout.data_start = 8 + header_size;
  layout.data_bytes = file_size - layout.data_start;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      layout.metadata = parse_metadata(file, value);
    } else {
      layout.tensors.push_back(parse_entry(file, key, value, layout.data_bytes));
    }
  }
  check_layout(file, layout.tensors, layout.data_bytes);
  return layout;
}

}  // namespace wd
