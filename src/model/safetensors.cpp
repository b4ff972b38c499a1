// safetensors reader over a mapping (rules in safetensors_format.cpp), zero-copy tensors, writers.
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
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/errors.hpp"
#include "core/logging.hpp"

// The format is little-endian and tensors are written straight from Torch's memory.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors I/O writes host memory as-is and needs a little-endian host");

namespace wd {
namespace {

using json = nlohmann::json;

// The safetensors dtypes Torch 1.13 can hold (safetensors_format.cpp knows every dtype; the
// wide unsigned and fp8 types validate and can be inspected, but cannot be loaded).
struct TorchDtype {
  const char* name;
  c10::ScalarType type;
};

const TorchDtype kTorchDtypes[] = {
    {"BOOL", c10::ScalarType::Bool},      {"U8", c10::ScalarType::Byte},
    {"I8", c10::ScalarType::Char},        {"I16", c10::ScalarType::Short},
    {"F16", c10::ScalarType::Half},       {"BF16", c10::ScalarType::BFloat16},
    {"I32", c10::ScalarType::Int},        {"F32", c10::ScalarType::Float},
    {"F64", c10::ScalarType::Double},     {"I64", c10::ScalarType::Long},
};

const TorchDtype* find_dtype(const std::string& name) {
  for (const TorchDtype& spec : kTorchDtypes) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

const TorchDtype* find_dtype(c10::ScalarType type) {
  for (const TorchDtype& spec : kTorchDtypes) {
    if (spec.type == type) return &spec;
  }
  return nullptr;
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

c10::ScalarType safetensors_to_scalar_type(const std::string& dtype) {
  if (safetensors_dtype_size(dtype) == 0) {
    throw Error("unknown safetensors dtype \"" + dtype + "\"");
  }
  const TorchDtype* spec = find_dtype(dtype);
  if (spec == nullptr) {
    throw Error("safetensors dtype " + dtype + " has no Torch scalar type in this build");
  }
  return spec->type;
}

std::string scalar_type_to_safetensors(c10::ScalarType type) {
  const TorchDtype* spec = find_dtype(type);
  if (spec == nullptr) {
    throw Error(std::string("Torch dtype ") + c10::toString(type) +
                " has no safetensors equivalent");
  }
  return spec->name;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile st;
  st.file_ = MappedFile::open(path);
  // The same validation the fuzzer exercises (tests/fuzz/fuzz_safetensors.cpp).
  SafetensorsLayout layout = parse_safetensors(st.file_->data(), st.file_->size(), path);
  st.data_start_ = layout.data_start;
  st.data_bytes_ = layout.data_bytes;
  st.metadata_ = std::move(layout.metadata);
  st.tensors_ = std::move(layout.tensors);
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
  const TorchDtype* spec = find_dtype(t.dtype);
  if (spec == nullptr) {
    throw Error(path() + ": " + name + ": dtype " + t.dtype +
                " is valid safetensors but this Torch has no such scalar type, so the tensor "
                "cannot be loaded");
  }
  const auto options = torch::TensorOptions().dtype(spec->type).device(torch::kCPU);
  const std::size_t element_size = safetensors_dtype_size(t.dtype);
  if (t.nbytes() == 0) return torch::empty(t.shape, options);

  std::uint8_t* data = file_->mutable_data() + data_start_ + t.begin;
  if (reinterpret_cast<std::uintptr_t>(data) % element_size != 0) {
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

void SafetensorsFile::release(const std::string& name) const {
  const TensorInfo& t = info(name);
  file_->release(data_start_ + t.begin, t.nbytes());
}

void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata) {
  struct Planned {
    const std::string* name;
    const torch::Tensor* tensor;
    const TorchDtype* spec;
    std::size_t element_size;
  };
  std::vector<Planned> plan;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") {
      throw Error("cannot write " + path +
                  ": \"__metadata__\" is reserved and cannot name a tensor");
    }
    if (!t.defined())
      throw Error("cannot write " + path + ": tensor \"" + name + "\" is undefined");
    const TorchDtype* spec = find_dtype(t.scalar_type());
    if (spec == nullptr) {
      throw Error("cannot write " + path + ": tensor \"" + name + "\" has Torch dtype " +
                  c10::toString(t.scalar_type()) + ", which safetensors cannot store");
    }
    plan.push_back({&name, &t, spec, safetensors_dtype_size(spec->name)});
  }
  // Data goes largest element first (then by name), as the reference writer does: with the
  // header padded to 8 bytes every tensor then starts aligned and loads zero-copy.
  std::stable_sort(plan.begin(), plan.end(),
                   [](const Planned& a, const Planned& b) {
                     return a.element_size > b.element_size;
                   });

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
