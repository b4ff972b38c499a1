// DatasetReader: reads samples of a validated HDF5 data set into float32 batches on the host.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "data/dataset_info.hpp"

namespace wd::data {

/// One batch of clean samples, float32 on the host.
struct CleanBatch {
  std::vector<std::int64_t> indices;  ///< sample indices in the file
  torch::Tensor latents;              ///< [B,C,F,H,W] float32; undefined for a contexts-only data set
  torch::Tensor context;              ///< [B,L,text_dim] float32, rows >= context_lens zero
  torch::Tensor context_lens;         ///< [B] int64
  /// [B,C,F,H,W] float32, the image condition as stored (/condition); undefined when the data set
  /// has none or it is ignored (data.ignore_condition).
  torch::Tensor condition;
  /// How the model takes `condition` (DatasetInfo::condition_kind).
  ImageCondition condition_kind = ImageCondition::kNone;
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

}  // namespace wd::data
