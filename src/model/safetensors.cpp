// safetensors: header validation, zero-copy tensors over the mapping, atomic (sharded) writes.
#include "model/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "core/errors.hpp"
#include "core/logging.hpp"

// The format is little-endian and tensors are written straight from Torch's memory.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors I/O writes host memory as-is and needs a little-endian host");

namespace wd {
namespace {

using json = nlohmann::json;

struct DtypeSpec {
  const char* name;
  std::size_t size;
  std::optional<c10::ScalarType> torch_type;  ///< empty where this Torch has no such type
};

// The dtypes of safetensors 0.4/0.5 (0.6 added sub-byte, E8M0 and complex types, which no Wan
// checkpoint uses). The wide unsigned and fp8 types validate and can be inspected, but Torch
// 1.13 cannot hold them.
const DtypeSpec kDtypes[] = {
    {"BOOL", 1, c10::ScalarType::Bool},
    {"U8", 1, c10::ScalarType::Byte},
    {"I8", 1, c10::ScalarType::Char},
    {"F8_E5M2", 1, std::nullopt},
    {"F8_E4M3", 1, std::nullopt},
    {"I16", 2, c10::ScalarType::Short},
    {"U16", 2, std::nullopt},
    {"F16", 2, c10::ScalarType::Half},
    {"BF16", 2, c10::ScalarType::BFloat16},
    {"I32", 4, c10::ScalarType::Int},
    {"U32", 4, std::nullopt},
    {"F32", 4, c10::ScalarType::Float},
    {"F64", 8, c10::ScalarType::Double},
    {"I64", 8, c10::ScalarType::Long},
    {"U64", 8, std::nullopt},
};

const DtypeSpec* find_dtype(const std::string& name) {
  for (const DtypeSpec& spec : kDtypes) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

const DtypeSpec* find_dtype(c10::ScalarType type) {
  for (const DtypeSpec& spec : kDtypes) {
    if (spec.torch_type == type) return &spec;
  }
  return nullptr;
}

std::string known_dtypes() {
  std::string names;
  for (const DtypeSpec& spec : kDtypes) {
    names += names.empty() ? "" : ", ";
    names += spec.name;
  }
  return names;
}

std::string offsets_string(const TensorInfo& t) {
  return "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
}

/// Parses the header, rejecting duplicate keys at any depth: nlohmann::json would silently
/// keep one of them, while safetensors refuses the file.
json parse_header(const std::string& file, const char* begin, const char* end) {
  struct Frame {
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<Frame> frames;
  const json::parser_callback_t track_keys = [&](int, json::parse_event_t event, json& parsed) {
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
          const std::string item = top ? key : frames.front().last_key;
          throw DataError(file, item,
                          "duplicate key \"" + key + "\" in the header" +
                              (top ? std::string() : " (inside the entry \"" + item + "\")"));
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
                  "__metadata__ value of \"" << key << "\" must be a string, got " << v.dump());
    metadata.emplace(key, v.get<std::string>());
  }
  return metadata;
}

TensorInfo parse_entry(const std::string& file, const std::string& name, const json& entry,
                       std::uint64_t data_size) {
  WD_CHECK_DATA(
      entry.is_object(), file, name,
      "tensor entry must be an object with \"dtype\", \"shape\" and \"data_offsets\", got "
          << entry.dump());
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    WD_CHECK_DATA(entry.contains(field), file, name, "tensor entry lacks \"" << field << "\"");
  }
  TensorInfo info;
  info.name = name;

  const json& dtype = entry.at("dtype");
  WD_CHECK_DATA(dtype.is_string(), file, name, "\"dtype\" must be a string, got " << dtype.dump());
  info.dtype = dtype.get<std::string>();
  const DtypeSpec* spec = find_dtype(info.dtype);
  WD_CHECK_DATA(spec != nullptr, file, name,
                "unknown dtype \"" << info.dtype << "\" (known: " << known_dtypes() << ")");

  const json& shape = entry.at("shape");
  WD_CHECK_DATA(shape.is_array(), file, name,
                "\"shape\" must be an array of non-negative integers, got " << shape.dump());
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const json& dim = shape[i];
    WD_CHECK_DATA(dim.is_number_unsigned(), file, name,
                  "shape[" << i << "] = " << dim.dump() << " is not a non-negative integer");
    const auto value = dim.get<std::uint64_t>();
    // safetensors allows any usize; Torch sizes are int64, so larger dimensions cannot load.
    WD_CHECK_DATA(
        value <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), file, name,
        "shape[" << i << "] = " << value << " exceeds the largest Torch dimension 2^63-1");
    info.shape.push_back(static_cast<std::int64_t>(value));
  }

  const json& offsets = entry.at("data_offsets");
  WD_CHECK_DATA(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                    offsets[1].is_number_unsigned(),
                file, name,
                "\"data_offsets\" must be [begin, end] with two non-negative integers, got "
                    << offsets.dump());
  info.begin = offsets[0].get<std::uint64_t>();
  info.end = offsets[1].get<std::uint64_t>();
  WD_CHECK_DATA(info.begin <= info.end, file, name,
                "data_offsets " << offsets_string(info) << " are reversed: begin " << info.begin
                                << " is greater than end " << info.end);

  // The product is taken in header order with overflow checks, as safetensors does, so a
  // crafted shape cannot wrap around to a small, matching byte count.
  std::uint64_t elements = 1;
  for (const std::int64_t dim : info.shape) {
    WD_CHECK_DATA(!__builtin_mul_overflow(elements, static_cast<std::uint64_t>(dim), &elements),
                  file, name,
                  "element count of shape " << format_shape(info.shape) << " overflows 64 bits");
  }
  std::uint64_t bytes = 0;
  WD_CHECK_DATA(!__builtin_mul_overflow(elements, spec->size, &bytes), file, name,
                "byte size of shape " << format_shape(info.shape) << " (" << elements
                                      << " elements) x " << spec->size << " bytes per "
                                      << info.dtype << " overflows 64 bits");
  WD_CHECK_DATA(bytes == info.nbytes(), file, name,
                "shape " << format_shape(info.shape) << " of " << info.dtype << " needs " << bytes
                         << " bytes but data_offsets " << offsets_string(info) << " span "
                         << info.nbytes() << " bytes");
  WD_CHECK_DATA(info.end <= data_size, file, name,
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
    WD_CHECK_DATA(t.begin >= covered, file, t.name,
                  "data_offsets " << offsets_string(t) << " overlap tensor \"" << previous->name
                                  << "\" at " << offsets_string(*previous));
    WD_CHECK_DATA(t.begin == covered, file, t.name,
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

std::uint64_t read_le64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

[[noreturn]] void throw_sys(const std::string& call, const std::string& path, int err) {
  throw SystemError(call + " failed while writing " + path + ": " + std::strerror(err) +
                    " (errno " + std::to_string(err) + ")");
}

/// A file written under a temporary name and renamed into place by commit(). Until then the
/// destination is untouched, and the destructor removes the temporary, so a failure anywhere
/// (a throw from Torch included) leaves either the old file or the complete new one.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path)
      : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(::getpid())) {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw_sys("open(" + tmp_ + ")", path_, errno);
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::size_t size) {
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw_sys("write(" + tmp_ + ")", path_, errno);
      }
      p += n;
      size -= static_cast<std::size_t>(n);
    }
  }

  void commit() {
    if (::fsync(fd_) != 0) throw_sys("fsync(" + tmp_ + ")", path_, errno);
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) throw_sys("close(" + tmp_ + ")", path_, errno);
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) throw_sys("rename(" + tmp_ + ")", path_, errno);
    committed_ = true;
    // The rename is durable only once the directory entry is on disk.
    const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
    const std::string dir = parent.empty() ? "." : parent.string();
    const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) throw_sys("open(" + dir + ")", path_, errno);
    const int rc = ::fsync(dir_fd);
    const int err = errno;
    ::close(dir_fd);
    // Some file systems cannot sync a directory (EINVAL); the data itself is already synced.
    if (rc != 0 && err != EINVAL) throw_sys("fsync(" + dir + ")", path_, err);
  }

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

std::uint64_t tensor_bytes(const torch::Tensor& t) {
  return static_cast<std::uint64_t>(t.numel()) * t.element_size();
}

}  // namespace

std::size_t safetensors_dtype_size(const std::string& dtype) {
  const DtypeSpec* spec = find_dtype(dtype);
  return spec ? spec->size : 0;
}

c10::ScalarType safetensors_to_scalar_type(const std::string& dtype) {
  const DtypeSpec* spec = find_dtype(dtype);
  if (spec == nullptr) throw Error("unknown safetensors dtype \"" + dtype + "\"");
  if (!spec->torch_type) {
    throw Error("safetensors dtype " + dtype + " has no Torch scalar type in this build");
  }
  return *spec->torch_type;
}

std::string scalar_type_to_safetensors(c10::ScalarType type) {
  const DtypeSpec* spec = find_dtype(type);
  if (spec == nullptr) {
    throw Error(std::string("Torch dtype ") + c10::toString(type) +
                " has no safetensors equivalent");
  }
  return spec->name;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile st;
  st.file_ = MappedFile::open(path);
  const std::uint8_t* bytes = st.file_->data();
  const std::uint64_t file_size = st.file_->size();

  WD_CHECK_DATA(file_size >= 8, path, "header",
                "file is " << file_size
                           << " bytes, shorter than the 8-byte header length that starts every "
                              "safetensors file");
  const std::uint64_t header_size = read_le64(bytes);
  WD_CHECK_DATA(header_size <= kMaxHeaderBytes, path, "header",
                "header length " << header_size << " exceeds the limit of " << kMaxHeaderBytes
                                 << " bytes (huge header)");
  WD_CHECK_DATA(header_size <= file_size - 8, path, "header",
                "header length " << header_size << " runs past the end of the file: it needs 8 + "
                                 << header_size << " = " << 8 + header_size
                                 << " bytes but the file has " << file_size);

  const char* text = reinterpret_cast<const char*>(bytes + 8);
  const json header = parse_header(path, text, text + header_size);
  WD_CHECK_DATA(header.is_object(), path, "header",
                "header is a JSON " << header.type_name() << ", not an object");
  WD_CHECK_DATA(text[0] == '{', path, "header",
                "header must start with '{' (safetensors refuses leading whitespace)");

  st.data_start_ = 8 + header_size;
  const std::uint64_t data_size = file_size - st.data_start_;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      st.metadata_ = parse_metadata(path, value);
    } else {
      st.tensors_.push_back(parse_entry(path, key, value, data_size));
    }
  }
  check_layout(path, st.tensors_, data_size);
  st.data_bytes_ = data_size;
  for (std::size_t i = 0; i < st.tensors_.size(); ++i) st.index_.emplace(st.tensors_[i].name, i);
  return st;
}

bool SafetensorsFile::contains(const std::string& name) const { return index_.count(name) != 0; }

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = index_.find(name);
  WD_CHECK_DATA(it != index_.end(), path(), name,
                "no such tensor in this file (it has " << tensors_.size() << " tensors)");
  return tensors_[it->second];
}

torch::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo& t = info(name);
  const DtypeSpec* spec = find_dtype(t.dtype);
  if (!spec->torch_type) {
    throw Error(path() + ": " + name + ": dtype " + t.dtype +
                " is valid safetensors but this Torch has no such scalar type, so the tensor "
                "cannot be loaded");
  }
  const auto options = torch::TensorOptions().dtype(*spec->torch_type).device(torch::kCPU);
  if (t.nbytes() == 0) return torch::empty(t.shape, options);

  std::uint8_t* data = file_->mutable_data() + data_start_ + t.begin;
  if (reinterpret_cast<std::uintptr_t>(data) % spec->size != 0) {
    // Writers that do not order data by element size can leave a tensor misaligned, and Torch
    // kernels may assume aligned elements: this one tensor is copied instead.
    torch::Tensor copy = torch::empty(t.shape, options);
    std::memcpy(copy.data_ptr(), data, t.nbytes());
    return copy;
  }
  // The deleter owns a reference to the mapping, so it outlives this object while any tensor
  // (or view of one) is alive.
  return torch::from_blob(
      data, t.shape, [mapping = file_](void*) {}, options);
}

torch::Tensor SafetensorsFile::tensor(const std::string& name, c10::ScalarType dtype,
                                      const torch::Device& device) const {
  torch::Tensor t = tensor(name);
  if (t.scalar_type() == dtype && device.is_cpu()) return t;
  return t.to(device, dtype);
}

void SafetensorsFile::prefetch(const std::string& name) const {
  const TensorInfo& t = info(name);
  file_->prefetch(data_start_ + t.begin, t.nbytes());
}

void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata) {
  struct Planned {
    const std::string* name;
    const torch::Tensor* tensor;
    const DtypeSpec* spec;
  };
  std::vector<Planned> plan;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") {
      throw Error("cannot write " + path +
                  ": \"__metadata__\" is reserved and cannot name a tensor");
    }
    if (!t.defined())
      throw Error("cannot write " + path + ": tensor \"" + name + "\" is undefined");
    const DtypeSpec* spec = find_dtype(t.scalar_type());
    if (spec == nullptr) {
      throw Error("cannot write " + path + ": tensor \"" + name + "\" has Torch dtype " +
                  c10::toString(t.scalar_type()) + ", which safetensors cannot store");
    }
    plan.push_back({&name, &t, spec});
  }
  // Data goes largest element first (then by name), as the reference writer does: with the
  // header padded to 8 bytes every tensor then starts aligned and loads zero-copy.
  std::stable_sort(plan.begin(), plan.end(),
                   [](const Planned& a, const Planned& b) { return a.spec->size > b.spec->size; });

  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const Planned& p : plan) {
    const std::uint64_t end = offset + tensor_bytes(*p.tensor);
    header[*p.name] = {{"dtype", p.spec->name},
                       {"shape", p.tensor->sizes().vec()},
                       {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  std::uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<std::uint8_t>(text.size() >> (8 * i));

  AtomicFile out(path);
  out.write(length, sizeof length);
  out.write(text.data(), text.size());
  for (const Planned& p : plan) {
    const std::uint64_t nbytes = tensor_bytes(*p.tensor);
    if (nbytes == 0) continue;
    const torch::Tensor host = p.tensor->to(torch::kCPU).contiguous();
    out.write(host.data_ptr(), nbytes);
  }
  out.commit();
}

ShardedWriteResult write_sharded_safetensors(const std::string& dir, const std::string& stem,
                                             const std::vector<TensorSource>& sources,
                                             std::uint64_t max_shard_bytes,
                                             const std::map<std::string, std::string>& metadata,
                                             const std::function<void(std::uint64_t)>& on_written) {
  ShardedWriteResult result;
  std::map<std::string, const TensorSource*> sorted;  // shards follow sorted key order
  for (const auto& src : sources) sorted[src.name] = &src;
  std::vector<std::vector<const TensorSource*>> shards(1);
  std::uint64_t shard_bytes = 0;
  for (const auto& [name, src] : sorted) {
    if (!shards.back().empty() && shard_bytes + src->nbytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(src);
    shard_bytes += src->nbytes;
    result.total_bytes += src->nbytes;
  }

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw SystemError("cannot create directory " + dir + ": " + ec.message());
  const std::filesystem::path root(dir);
  const std::string index_name = stem + ".safetensors.index.json";

  json weight_map = json::object();
  for (std::size_t k = 0; k < shards.size(); ++k) {
    char suffix[64];
    std::snprintf(suffix, sizeof suffix, "-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    const std::string name = shards.size() == 1 ? stem + ".safetensors" : stem + suffix;
    // Only this shard's tensors are materialised, so writers of huge checkpoints stay small.
    TensorMap tensors;
    std::uint64_t bytes = 0;
    for (const auto* src : shards[k]) {
      tensors.emplace(src->name, src->produce());
      weight_map[src->name] = name;
      bytes += src->nbytes;
    }
    write_safetensors((root / name).string(), tensors, metadata);
    result.shard_files.push_back(name);
    if (on_written) on_written(bytes);
  }
  if (shards.size() == 1) {
    // Loaders prefer an index over a lone file, so an index left by an earlier sharded write
    // of the same stem would shadow the file just written.
    std::filesystem::remove(root / index_name, ec);
    if (ec)
      throw SystemError("cannot remove stale index " + (root / index_name).string() + ": " +
                        ec.message());
    return result;
  }
  const json index = {{"metadata", {{"total_size", result.total_bytes}}},
                      {"weight_map", weight_map}};
  write_file_atomically((root / index_name).string(), index.dump(2) + "\n");
  result.index_file = index_name;
  return result;
}

ShardedWriteResult write_sharded_safetensors(const std::string& dir, const std::string& stem,
                                             const TensorMap& tensors,
                                             std::uint64_t max_shard_bytes,
                                             const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSource> sources;
  for (const auto& [name, t] : tensors) {
    sources.push_back({name, t.defined() ? tensor_bytes(t) : 0, [t = t] { return t; }});
  }
  return write_sharded_safetensors(dir, stem, sources, max_shard_bytes, metadata);
}

void write_file_atomically(const std::string& path, const std::string& content) {
  AtomicFile out(path);
  out.write(content.data(), content.size());
  out.commit();
}

}  // namespace wd
