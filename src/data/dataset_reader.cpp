// DatasetReader: per-sample reads of a validated HDF5 data set into float32 batches.
#include "data/dataset_reader.hpp"

#include "core/errors.hpp"
#include "core/logging.hpp"
#include "data/dataset_schema.hpp"
#include "data/h5_file.hpp"

namespace wd::data {
namespace {

/// Float16 data in the IEEE binary16 layout (what we and h5py write) is read raw and widened by
/// Torch, which is much faster than HDF5's soft conversion; any other float16 flavour (say,
/// big-endian) is converted to float32 by HDF5.
bool is_ieee_half(hid_t type) {
  const H5Datatype half = h5_float16_type();
  return H5Tequal(type, half.get()) > 0;
}

}  // namespace

struct DatasetReader::Impl {
  DatasetInfo info;
  H5File file;
  H5Dataset latents;
  H5Dataset context;
  H5Dataset condition;  ///< open when the data set's /condition is read (DatasetInfo::reads_condition)
  H5Datatype half_type = h5_float16_type();
  bool latents_raw_half = false;
  bool context_raw_half = false;
  bool condition_raw_half = false;
  std::vector<std::int64_t> lens;

  /// Reads row `index` of `dataset` into `dst`, a contiguous float32 tensor of the row's shape.
  void read_row(hid_t dataset, bool raw_half, const char* name, std::int64_t index,
                torch::Tensor dst) const {
    const std::string& path = info.path;
    const H5Dataspace file_space(WD_CHECK_H5(H5Dget_space(dataset), path, name));
    const int rank = H5Sget_simple_extent_ndims(file_space.get());
    std::vector<hsize_t> start(static_cast<std::size_t>(rank), 0);
    std::vector<hsize_t> count(static_cast<std::size_t>(rank), 1);
    start[0] = static_cast<hsize_t>(index);
    for (int d = 1; d < rank; ++d) count[d] = static_cast<hsize_t>(dst.size(d - 1));
    WD_CHECK_H5(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                    count.data(), nullptr),
                path, name);
    const H5Dataspace mem_space(
        WD_CHECK_H5(H5Screate_simple(rank, count.data(), nullptr), path, name));
    if (raw_half) {
      auto half = torch::empty(dst.sizes(), torch::kHalf);
      WD_CHECK_H5(H5Dread(dataset, half_type.get(), mem_space.get(), file_space.get(), H5P_DEFAULT,
                          half.data_ptr()),
                  path, name);
      dst.copy_(half);
    } else {
      WD_CHECK_H5(H5Dread(dataset, H5T_NATIVE_FLOAT, mem_space.get(), file_space.get(), H5P_DEFAULT,
                          dst.data_ptr()),
                  path, name);
    }
  }
};

DatasetReader::DatasetReader(const DatasetInfo& info) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.info = info;
  m.file = h5_open_read_only(info.path);
  const std::string& path = info.path;
  if (info.has_latents) m.latents = H5Dataset(WD_CHECK_H5(H5Dopen2(m.file.get(), kLatents, H5P_DEFAULT), path, kLatents));
  m.context = H5Dataset(WD_CHECK_H5(H5Dopen2(m.file.get(), kContext, H5P_DEFAULT), path, kContext));
  // The file may have been replaced since validation; reading a different shape would be wrong.
  const auto& c = info.latent_shape;
  const std::vector<std::int64_t> latent_dims{info.samples, c[0], c[1], c[2], c[3]};
  const std::vector<std::int64_t> context_dims{info.samples, info.context_len, info.text_dim};
  WD_CHECK_DATA(!info.has_latents || h5_dims(m.latents.get(), path, kLatents) == latent_dims, path, kLatents,
                "shape changed since validation, expected " << format_shape(latent_dims));
  WD_CHECK_DATA(h5_dims(m.context.get(), path, kContext) == context_dims, path, kContext,
                "shape changed since validation, expected " << format_shape(context_dims));
  if (info.has_latents) {
    const H5Datatype latent_type(WD_CHECK_H5(H5Dget_type(m.latents.get()), path, kLatents));
    m.latents_raw_half = is_ieee_half(latent_type.get());
  }
  const H5Datatype context_type(WD_CHECK_H5(H5Dget_type(m.context.get()), path, kContext));
  m.context_raw_half = is_ieee_half(context_type.get());
  if (info.reads_condition()) {
    m.condition = H5Dataset(WD_CHECK_H5(H5Dopen2(m.file.get(), kCondition, H5P_DEFAULT), path, kCondition));
    const auto& k = info.condition_shape;
    const std::vector<std::int64_t> condition_dims{info.samples, k[0], k[1], k[2], k[3]};
    WD_CHECK_DATA(h5_dims(m.condition.get(), path, kCondition) == condition_dims, path, kCondition,
                  "shape changed since validation, expected " << format_shape(condition_dims));
    const H5Datatype condition_type(WD_CHECK_H5(H5Dget_type(m.condition.get()), path, kCondition));
    m.condition_raw_half = is_ieee_half(condition_type.get());
  }

  const H5Dataset lens(
      WD_CHECK_H5(H5Dopen2(m.file.get(), kContextLens, H5P_DEFAULT), path, kContextLens));
  m.lens.resize(static_cast<std::size_t>(info.samples));
  WD_CHECK_H5(H5Dread(lens.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, m.lens.data()),
              path, kContextLens);
  // read() narrows /context by these lengths, so a file replaced since validation must not
  // smuggle in a length outside 1..L.
  for (std::size_t i = 0; i < m.lens.size(); ++i) {
    WD_CHECK_DATA(m.lens[i] >= 1 && m.lens[i] <= info.context_len, path,
                  std::string(kContextLens) + "[" + std::to_string(i) + "]",
                  "is " << m.lens[i] << " (changed since validation), expected 1.."
                        << info.context_len);
  }
}

DatasetReader::~DatasetReader() = default;
DatasetReader::DatasetReader(DatasetReader&&) noexcept = default;
DatasetReader& DatasetReader::operator=(DatasetReader&&) noexcept = default;

const DatasetInfo& DatasetReader::info() const { return impl_->info; }

CleanBatch DatasetReader::read(const std::vector<std::int64_t>& indices) {
  const Impl& m = *impl_;
  const DatasetInfo& info = m.info;
  const auto batch = static_cast<std::int64_t>(indices.size());
  const auto& c = info.latent_shape;
  CleanBatch out;
  out.indices = indices;
  if (info.has_latents) out.latents = torch::empty({batch, c[0], c[1], c[2], c[3]}, torch::kFloat);
  out.context = torch::empty({batch, info.context_len, info.text_dim}, torch::kFloat);
  out.context_lens = torch::empty({batch}, torch::kLong);
  const auto& k = info.condition_shape;
  if (info.reads_condition()) {
    out.condition = torch::empty({batch, k[0], k[1], k[2], k[3]}, torch::kFloat);
    out.condition_kind = info.condition_kind;
  }
  auto lens = out.context_lens.accessor<std::int64_t, 1>();
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t index = indices[static_cast<std::size_t>(b)];
    WD_CHECK_DATA(index >= 0 && index < info.samples, info.path, kContext,
                  "sample index " << index << " is outside 0.." << info.samples - 1);
    if (info.has_latents) m.read_row(m.latents.get(), m.latents_raw_half, kLatents, index, out.latents[b]);
    m.read_row(m.context.get(), m.context_raw_half, kContext, index, out.context[b]);
    if (info.reads_condition()) m.read_row(m.condition.get(), m.condition_raw_half, kCondition, index, out.condition[b]);
    const std::int64_t len = m.lens[static_cast<std::size_t>(index)];
    lens[b] = len;
    // Rows past the prompt's length are padding whatever the file holds; the teacher's text
    // embedding expects them to be zero, as Wan pads its T5 output.
    out.context[b].narrow(0, len, info.context_len - len).zero_();
  }
  return out;
}

}  // namespace wd::data
