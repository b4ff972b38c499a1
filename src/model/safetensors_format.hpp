// parse_safetensors: validates a safetensors file image in memory, without Torch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace wd {

/// One tensor entry of a safetensors header.
struct TensorInfo {
  std::string name;
  std::string dtype;               ///< safetensors dtype name, e.g. "F32", "BF16"
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;         ///< offset relative to the start of the data section
  std::uint64_t end = 0;           ///< exclusive
  std::uint64_t nbytes() const { return end - begin; }
};

/// What a valid safetensors file holds, apart from the tensor bytes themselves.
struct SafetensorsLayout {
  std::uint64_t data_start = 0;  ///< 8 + header length: where the data section begins
  std::uint64_t data_bytes = 0;  ///< size of the data section (the file's remaining bytes)
  std::map<std::string, std::string> metadata;  ///< `__metadata__`; empty when absent
  std::vector<TensorInfo> tensors;              ///< sorted by data offset
};

/// Largest header accepted, as in safetensors itself: a longer one is a corrupt length prefix.
constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
/// Deepest JSON nesting accepted in a header (serde_json's limit, which safetensors inherits);
/// a valid header nests three levels.
constexpr int kSafetensorsMaxHeaderDepth = 128;

/// Bytes per element of a safetensors dtype name, or 0 when the name is unknown.
std::size_t safetensors_dtype_size(const std::string& dtype);

/// Validates the `size` bytes at `data` as a whole safetensors file and returns its layout.
/// Checks every rule safetensors itself enforces (header length, JSON object starting with '{',
/// nesting depth, unique keys, metadata strings, known dtypes, sizes with overflow checks,
/// offsets in bounds, tensors tiling the data section exactly). Each violation is a
/// wd::DataError naming `file` (used only in messages), the tensor or "header", and the rule.
/// Reads nothing outside [data, data + size), and nothing of the data section.
SafetensorsLayout parse_safetensors(const std::uint8_t* data, std::size_t size,
                                    const std::string& file);

}  // namespace wd
