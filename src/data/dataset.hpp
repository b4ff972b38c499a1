// The HDF5 training data set: schema validation, per-sample reads, and the synthetic generator.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace wd::data {

/// What the teacher needs the data set to look like (from the teacher's model config).
struct DatasetExpectations {
  std::int64_t latent_channels = 0;  ///< C of /latents (teacher in_dim, minus y channels for i2v)
  std::int64_t text_dim = 0;         ///< last dim of /context
  std::int64_t text_len = 0;         ///< /context rows must be <= this
  std::array<std::int64_t, 3> patch{1, 2, 2};  ///< F, H, W must be divisible by these
};

/// Facts read from a validated data set file.
struct DatasetInfo {
  std::string path;
  std::int64_t samples = 0;                    ///< N
  std::array<std::int64_t, 4> latent_shape{};  ///< C, F, H, W
  std::int64_t context_len = 0;                ///< L (rows per sample in /context)
  std::int64_t text_dim = 0;
  std::string latent_dtype;   ///< "float32" | "float16"
  std::string context_dtype;  ///< "float32" | "float16"
  bool has_prompts = false;
  std::int64_t schema_version = 1;
  std::string latent_layout;  ///< root attribute, "CFHW"
};

/// Opens `path` read-only and validates it (datasets present, ranks, dims matching
/// `expect`, dtype classes, N >= 1, context_lens within 1..L, sizes within the file). Every
/// problem is a wd::DataError naming the file, the dataset and the expected value.
DatasetInfo validate_dataset(const std::string& path, const DatasetExpectations& expect);

/// One batch of clean samples, float32 on the host.
struct CleanBatch {
  std::vector<std::int64_t> indices;  ///< sample indices in the file
  torch::Tensor latents;              ///< [B,C,F,H,W] float32
  torch::Tensor context;              ///< [B,L,text_dim] float32, rows >= context_lens zero
  torch::Tensor context_lens;         ///< [B] int64
};

/// Reads samples from a validated data set; holds the file open (RAII) for its lifetime.
class DatasetReader {
 public:
  explicit DatasetReader(const DatasetInfo& info);
  ~DatasetReader();
  DatasetReader(DatasetReader&&) noexcept;
  DatasetReader& operator=(DatasetReader&&) noexcept;
  DatasetReader(const DatasetReader&) = delete;
  DatasetReader& operator=(const DatasetReader&) = delete;

  const DatasetInfo& info() const;
  /// Reads the given samples (any order, repeats allowed) into one batch.
  CleanBatch read(const std::vector<std::int64_t>& indices);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Parameters of `wan-distill make-dataset`.
struct SyntheticDatasetSpec {
  std::string output;
  std::int64_t samples = 64;
  std::array<std::int64_t, 4> latent{16, 3, 16, 16};  ///< C, F, H, W
  std::int64_t text_len = 16;
  std::int64_t text_dim = 64;
  std::uint64_t seed = 0;
  bool half = false;  ///< store float16 instead of float32
};

/// Writes a synthetic data set: spatially smooth latents (low-resolution noise upsampled, not
/// white noise), context features with lengths varied over 1..text_len, chunked per sample,
/// atomically (temporary name, then rename), with progress logged. Deterministic from the seed.
void write_synthetic_dataset(const SyntheticDatasetSpec& spec);

}  // namespace wd::data
