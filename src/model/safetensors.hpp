// safetensors reader (mmap, full validation, zero-copy tensors) and atomic (sharded) writer.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/mapped_file.hpp"
#include "model/safetensors_format.hpp"

namespace wd {

/// Torch scalar type for a safetensors dtype name; throws wd::Error when Torch lacks it.
c10::ScalarType safetensors_to_scalar_type(const std::string& dtype);
/// safetensors dtype name for a Torch scalar type; throws wd::Error for unsupported types.
std::string scalar_type_to_safetensors(c10::ScalarType type);

/// A validated, memory-mapped safetensors file. Opening runs parse_safetensors over the mapping,
/// so every rule safetensors itself enforces is checked (header size, JSON object, unique keys,
/// metadata strings, known dtypes, sizes with overflow checks, offsets in bounds, contiguous and
/// covering the data exactly); each violation is a wd::DataError naming the file, the tensor
/// and the rule.
class SafetensorsFile {
 public:
  static constexpr std::uint64_t kMaxHeaderBytes = kSafetensorsMaxHeaderBytes;

  /// Maps and validates `path`.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const noexcept { return file_->path(); }
  /// `__metadata__` (string to string); empty when absent.
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  /// Entries sorted by data offset.
  const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }
  bool contains(const std::string& name) const;
  /// Entry by name; throws wd::DataError naming the file when absent.
  const TensorInfo& info(const std::string& name) const;
  /// Size of the data section (sum of all tensor bytes).
  std::uint64_t data_bytes() const noexcept { return data_bytes_; }

  /// Zero-copy CPU tensor viewing the mapping; the mapping lives as long as any such tensor.
  /// (A tensor whose offset is not a multiple of its element size is copied instead.)
  torch::Tensor tensor(const std::string& name) const;
  /// The tensor converted to `dtype` on `device`; zero-copy when nothing changes.
  torch::Tensor tensor(const std::string& name, c10::ScalarType dtype,
                       const torch::Device& device = torch::kCPU) const;

  /// Asks the kernel to read a tensor's pages ahead of use.
  void prefetch(const std::string& name) const;
  /// Drops a tensor's pages from the resident set once it is no longer needed (see
  /// MappedFile::release); views of it stay valid and read the file again if used.
  void release(const std::string& name) const;

  /// The mapping the tensors view (to tell whether a tensor is zero-copy, or to prefetch).
  const MappedFile& mapping() const noexcept { return *file_; }

 private:
  SafetensorsFile() = default;
  std::shared_ptr<MappedFile> file_;
  std::uint64_t data_start_ = 0;  ///< 8 + header length
  std::uint64_t data_bytes_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t> index_;  ///< name -> position in tensors_
};

/// Named tensors to write; header keys are written sorted, data largest element size first
/// and then by name (as the reference writer does), so every tensor starts aligned.
using TensorMap = std::map<std::string, torch::Tensor>;

/// Writes `tensors` to `path` atomically: a temporary file beside it, fsync, rename, fsync of
/// the directory. Tensors may live on any device / be non-contiguous; they are written as their
/// own dtype, little-endian, row-major.
void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Result of a sharded write: the files written (index last, when there is one).
struct ShardedWriteResult {
  std::vector<std::string> shard_files;  ///< names relative to the directory
  std::string index_file;                ///< empty when everything fit in one file
  std::uint64_t total_bytes = 0;         ///< sum of tensor bytes ("total_size" of the index)
};

/// Writes `tensors` into `dir` as `<stem>.safetensors` when they fit in `max_shard_bytes`,
/// otherwise as `<stem>-0000k-of-0000n.safetensors` shards (keys in sorted order, a new shard
/// whenever the next tensor would exceed the limit) plus `<stem>.safetensors.index.json` with
/// {"metadata": {"total_size": N}, "weight_map": {...}}. Every file is written atomically.
ShardedWriteResult write_sharded_safetensors(const std::string& dir, const std::string& stem,
                                             const TensorMap& tensors,
                                             std::uint64_t max_shard_bytes,
                                             const std::map<std::string, std::string>& metadata = {});

/// A tensor to write, produced only when its shard is written.
struct TensorSource {
  std::string name;
  std::uint64_t nbytes = 0;  ///< bytes it will have on disk (used to plan the shards)
  std::function<torch::Tensor()> produce;
};

/// As above, but each tensor is produced on demand: at most one shard's tensors exist at a
/// time, so a 57 GB checkpoint can be written with a few GB of memory. `on_written` is told
/// the bytes of each shard once it is on disk (for progress).
ShardedWriteResult write_sharded_safetensors(const std::string& dir, const std::string& stem,
                                             const std::vector<TensorSource>& sources,
                                             std::uint64_t max_shard_bytes,
                                             const std::map<std::string, std::string>& metadata = {},
                                             const std::function<void(std::uint64_t)>& on_written = {});

/// Writes `content` to `path` atomically (temporary file, fsync, rename, directory fsync).
void write_file_atomically(const std::string& path, const std::string& content);

}  // namespace wd
