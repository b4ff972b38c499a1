// The synthetic data set of `make-dataset`: smooth latents and varied-length contexts, written
// atomically in the schema's layout.
#include "data/synthetic_dataset.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "core/config.hpp"
#include "core/errors.hpp"
#include "core/logging.hpp"
#include "data/dataset_schema.hpp"
#include "data/h5_file.hpp"
#include "data/splitmix64.hpp"

namespace wd::data {
namespace {

/// Writes the whole of `data` into the row `index` of a dataset whose first dimension is N.
void write_row(hid_t dataset, hid_t mem_type, const void* data, std::int64_t index,
               const std::string& path, const char* name) {
  const H5Dataspace file_space(WD_CHECK_H5(H5Dget_space(dataset), path, name));
  const int rank = H5Sget_simple_extent_ndims(file_space.get());
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(file_space.get(), dims.data(), nullptr);
  std::vector<hsize_t> start(dims.size(), 0), count = dims;
  start[0] = static_cast<hsize_t>(index);
  count[0] = 1;
  WD_CHECK_H5(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                  count.data(), nullptr),
              path, name);
  const H5Dataspace mem_space(
      WD_CHECK_H5(H5Screate_simple(rank, count.data(), nullptr), path, name));
  WD_CHECK_H5(H5Dwrite(dataset, mem_type, mem_space.get(), file_space.get(), H5P_DEFAULT, data),
              path, name);
}

/// Removes the temporary file unless it was renamed into place.
class TempFile {
 public:
  explicit TempFile(std::string final_path)
      : final_(std::move(final_path)), tmp_(final_ + ".tmp." + std::to_string(::getpid())) {}
  ~TempFile() {
    if (!committed_) ::unlink(tmp_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  const std::string& path() const { return tmp_; }

  /// fsyncs the closed temporary file, renames it to the final name and fsyncs the directory,
  /// so a crash leaves either the old file or the complete new one.
  void commit() {
    fsync_path(tmp_, O_RDONLY);
    WD_CHECK_SYS(::rename(tmp_.c_str(), final_.c_str()), tmp_ + " -> " + final_);
    committed_ = true;
    const auto dir = std::filesystem::absolute(final_).parent_path();
    fsync_path(dir.string(), O_RDONLY | O_DIRECTORY);
  }

 private:
  static void fsync_path(const std::string& path, int flags) {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
    WD_CHECK_SYS(fd, path);
    const int rc = ::fsync(fd);
    ::close(fd);
    WD_CHECK_SYS(rc, path);
  }

  std::string final_;
  std::string tmp_;
  bool committed_ = false;
};

/// Spatially (and temporally) smooth latents: white noise on a grid 4x coarser in H and W and
/// 2x in F, trilinearly upsampled, then scaled to unit std like real VAE latents.
torch::Tensor smooth_latent(const std::array<std::int64_t, 4>& shape, at::Generator& gen) {
  const auto [channels, frames, height, width] = shape;
  const auto coarse = [](std::int64_t n, std::int64_t f) {
    return std::max<std::int64_t>(1, (n + f - 1) / f);
  };
  auto low = torch::randn({1, channels, coarse(frames, 2), coarse(height, 4), coarse(width, 4)},
                          gen, torch::TensorOptions().dtype(torch::kFloat));
  namespace F = torch::nn::functional;
  auto x = F::interpolate(low, F::InterpolateFuncOptions()
                                   .size(std::vector<std::int64_t>{frames, height, width})
                                   .mode(torch::kTrilinear)
                                   .align_corners(true))[0];
  const double std = x.std(/*unbiased=*/false).item<double>();
  return std > 1e-6 ? x.div_(std) : x;
}

/// Sample `i` of a `classes` data set: its class's pattern shifted (a frame moving by its own
/// step), scaled, plus small noise; deterministic from (seed, i).
torch::Tensor class_latent(const torch::Tensor& pattern, std::int64_t i, std::uint64_t seed, at::Generator& gen) {
  SplitMix64 rng(hash_keys(seed, 4, static_cast<std::uint64_t>(i)));
  const auto height = pattern.size(2), width = pattern.size(3);
  const auto span = [&](std::int64_t n) {
    const auto q = std::max<std::int64_t>(1, n / 4);
    return static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(2 * q + 1))) - q;
  };
  const auto dy = span(height), dx = span(width);
  const auto my = static_cast<std::int64_t>(rng.below(3)) - 1, mx = static_cast<std::int64_t>(rng.below(3)) - 1;
  const double amplitude = 0.8 + 0.4 * static_cast<double>(rng.below(1'000'001)) / 1e6;
  auto x = torch::empty_like(pattern);
  for (std::int64_t f = 0; f < pattern.size(1); ++f) {
    x.select(1, f).copy_(torch::roll(pattern.select(1, f), {dy + f * my, dx + f * mx}, {1, 2}));
  }
  return x.mul_(amplitude).add_(torch::randn(pattern.sizes(), gen, torch::TensorOptions().dtype(torch::kFloat)), 0.05);
}

void check_spec(const SyntheticDatasetSpec& spec) {
  ConfigProblems problems;
  problems.check(spec.kind != DatasetKind::kClasses || spec.classes >= 2,
                 "classes(" + std::to_string(spec.classes) + ") must be >= 2");
  problems.check(!spec.output.empty(), "output must be given");
  problems.check(spec.samples >= 1, "samples(" + std::to_string(spec.samples) + ") must be >= 1");
  for (int d = 0; d < 4; ++d) {
    problems.check(spec.latent[d] >= 1, std::string("latent ") + "CFHW"[d] + "(" +
                                            std::to_string(spec.latent[d]) + ") must be >= 1");
  }
  problems.check(spec.text_len >= 1,
                 "text_len(" + std::to_string(spec.text_len) + ") must be >= 1");
  problems.check(spec.text_dim >= 1,
                 "text_dim(" + std::to_string(spec.text_dim) + ") must be >= 1");
  problems.throw_if_any("make-dataset");
}

H5Dataset create_chunked(hid_t file, const std::string& path, const char* name, hid_t type,
                         const std::vector<hsize_t>& dims) {
  const H5Dataspace space(WD_CHECK_H5(
      H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), path, name));
  const H5PropertyList dcpl(WD_CHECK_H5(H5Pcreate(H5P_DATASET_CREATE), path, name));
  // One chunk per sample: a reader fetching one sample touches exactly one chunk.
  std::vector<hsize_t> chunk = dims;
  chunk[0] = 1;
  WD_CHECK_H5(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), path, name);
  return H5Dataset(WD_CHECK_H5(
      H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), path, name));
}

H5Dataset create_contiguous(hid_t file, const std::string& path, const char* name, hid_t type,
                            hsize_t n) {
  const H5Dataspace space(WD_CHECK_H5(H5Screate_simple(1, &n, nullptr), path, name));
  return H5Dataset(
      WD_CHECK_H5(H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                  path, name));
}

void write_root_attrs(hid_t file, const std::string& path) {
  const H5Dataspace scalar(WD_CHECK_H5(H5Screate(H5S_SCALAR), path, ""));
  const std::int32_t version = static_cast<std::int32_t>(kSchemaVersion);
  const H5Attribute v(WD_CHECK_H5(
      H5Acreate2(file, kSchemaAttr, H5T_STD_I32LE, scalar.get(), H5P_DEFAULT, H5P_DEFAULT), path,
      root_attr(kSchemaAttr)));
  WD_CHECK_H5(H5Awrite(v.get(), H5T_NATIVE_INT32, &version), path, root_attr(kSchemaAttr));
  const H5Datatype str = h5_vlen_string_type();
  const H5Attribute layout(
      WD_CHECK_H5(H5Acreate2(file, kLayoutAttr, str.get(), scalar.get(), H5P_DEFAULT, H5P_DEFAULT),
                  path, root_attr(kLayoutAttr)));
  const char* text = kLatentLayout;
  WD_CHECK_H5(H5Awrite(layout.get(), str.get(), &text), path, root_attr(kLayoutAttr));
}

/// A contexts-only set's root attribute latent_shape (C, F, H, W of the latents it has none of).
void write_latent_shape(hid_t file, const std::string& path, const std::array<std::int64_t, 4>& c) {
  const hsize_t four = 4;
  const H5Dataspace space(WD_CHECK_H5(H5Screate_simple(1, &four, nullptr), path, root_attr(kLatentShapeAttr)));
  const H5Attribute shape(WD_CHECK_H5(
      H5Acreate2(file, kLatentShapeAttr, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), path,
      root_attr(kLatentShapeAttr)));
  WD_CHECK_H5(H5Awrite(shape.get(), H5T_NATIVE_INT64, c.data()), path, root_attr(kLatentShapeAttr));
}

/// A classes set's /labels and /class_patterns.
void write_classes(hid_t file, const std::string& path, const std::vector<std::int32_t>& labels,
                   const std::vector<torch::Tensor>& patterns) {
  const H5Dataset labels_ds = create_contiguous(file, path, kLabels, H5T_STD_I32LE, labels.size());
  WD_CHECK_H5(H5Dwrite(labels_ds.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data()), path,
              kLabels);
  const auto all = torch::stack(patterns).contiguous();
  std::vector<hsize_t> dims;
  for (const auto d : all.sizes()) dims.push_back(static_cast<hsize_t>(d));
  const H5Dataspace space(
      WD_CHECK_H5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), path, kClassPatterns));
  const H5Dataset pattern_ds(WD_CHECK_H5(
      H5Dcreate2(file, kClassPatterns, H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path,
      kClassPatterns));
  WD_CHECK_H5(H5Dwrite(pattern_ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, all.data_ptr()), path,
              kClassPatterns);
}

/// Writes the whole data set into `path`; every handle is closed (and checked) on return.
void write_contents(const std::string& path, const SyntheticDatasetSpec& spec) {
  const auto n = static_cast<hsize_t>(spec.samples);
  const auto& c = spec.latent;
  const auto text_len = static_cast<hsize_t>(spec.text_len);
  const auto text_dim = static_cast<hsize_t>(spec.text_dim);

  H5File file = h5_create(path);
  write_root_attrs(file.get(), path);
  if (spec.contexts_only) write_latent_shape(file.get(), path, c);
  {
    const H5Datatype half = h5_float16_type();
    const hid_t store_type = spec.half ? half.get() : H5T_IEEE_F32LE;
    const hid_t mem_type = spec.half ? half.get() : H5T_NATIVE_FLOAT;
    const auto store_dtype = spec.half ? torch::kHalf : torch::kFloat;
    const H5Dataset latents =
        spec.contexts_only ? H5Dataset()
                           : create_chunked(file.get(), path, kLatents, store_type,
                                            {n, static_cast<hsize_t>(c[0]), static_cast<hsize_t>(c[1]),
                                             static_cast<hsize_t>(c[2]), static_cast<hsize_t>(c[3])});
    const H5Dataset context =
        create_chunked(file.get(), path, kContext, store_type, {n, text_len, text_dim});
    // The image condition: the latent's first frame, then (i2v) zero frames up to F.
    const std::int64_t condition_frames = spec.condition == ImageCondition::kI2v ? c[1] : 1;
    const H5Dataset condition =
        spec.condition == ImageCondition::kNone
            ? H5Dataset()
            : create_chunked(file.get(), path, kCondition, store_type,
                             {n, static_cast<hsize_t>(c[0]), static_cast<hsize_t>(condition_frames),
                              static_cast<hsize_t>(c[2]), static_cast<hsize_t>(c[3])});

    std::vector<std::int32_t> lens(n);
    std::vector<std::string> prompts(n);
    // classes: each class's pattern and context, from generators of their own.
    const bool classes = spec.kind == DatasetKind::kClasses;
    std::vector<torch::Tensor> patterns, class_contexts;
    std::vector<std::int32_t> labels(classes ? n : 0);
    for (std::int64_t k = 0; classes && k < spec.classes; ++k) {
      auto gen = at::detail::createCPUGenerator(hash_keys(spec.seed, 2, static_cast<std::uint64_t>(k)));
      patterns.push_back(smooth_latent(c, gen));
      class_contexts.push_back(torch::randn({spec.text_len, spec.text_dim}, gen, torch::TensorOptions().dtype(torch::kFloat)));
    }
    const double sample_bytes =
        static_cast<double>(c[0] * c[1] * c[2] * c[3] + spec.text_len * spec.text_dim +
                            (spec.condition == ImageCondition::kNone ? 0 : c[0] * condition_frames * c[2] * c[3])) *
        (spec.half ? 2 : 4);
    Progress progress("make-dataset " + spec.output, static_cast<double>(n) * sample_bytes,
                      "bytes");
    for (std::int64_t i = 0; i < spec.samples; ++i) {
      // Each sample has its own generator, so sample i is the same whatever N is.
      auto gen =
          at::detail::createCPUGenerator(hash_keys(spec.seed, 0, static_cast<std::uint64_t>(i)));
      const auto label = classes ? i % spec.classes : 0;
      // Drawn whether or not written: the contexts of a contexts-only set equal the full set's.
      const auto latent = (classes ? class_latent(patterns[static_cast<std::size_t>(label)], i, spec.seed, gen)
                                   : smooth_latent(c, gen))
                              .to(store_dtype)
                              .contiguous();
      if (!spec.contexts_only) write_row(latents.get(), mem_type, latent.data_ptr(), i, path, kLatents);
      if (spec.condition != ImageCondition::kNone) {
        auto image = torch::zeros({c[0], condition_frames, c[2], c[3]}, store_dtype);
        image.narrow(1, 0, 1).copy_(latent.narrow(1, 0, 1));
        write_row(condition.get(), mem_type, image.data_ptr(), i, path, kCondition);
      }

      SplitMix64 rng(hash_keys(spec.seed, 1, static_cast<std::uint64_t>(i)));
      const auto len = classes ? spec.text_len : static_cast<std::int64_t>(1 + rng.below(text_len));
      lens[i] = static_cast<std::int32_t>(len);
      auto ctx = torch::zeros({spec.text_len, spec.text_dim}, torch::kFloat);
      ctx.narrow(0, 0, len).copy_(classes ? class_contexts[static_cast<std::size_t>(label)]
                                          : torch::randn({len, spec.text_dim}, gen,
                                                         torch::TensorOptions().dtype(torch::kFloat)));
      ctx = ctx.to(store_dtype).contiguous();
      write_row(context.get(), mem_type, ctx.data_ptr(), i, path, kContext);
      if (classes) labels[i] = static_cast<std::int32_t>(label);
      prompts[i] = classes ? "class " + std::to_string(label) : "synthetic sample " + std::to_string(i);
      progress.advance(sample_bytes);
    }

    const H5Dataset lens_ds = create_contiguous(file.get(), path, kContextLens, H5T_STD_I32LE, n);
    WD_CHECK_H5(
        H5Dwrite(lens_ds.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, lens.data()), path,
        kContextLens);
    const H5Datatype str = h5_vlen_string_type();
    const H5Dataset prompts_ds = create_contiguous(file.get(), path, kPrompts, str.get(), n);
    std::vector<const char*> texts(n);
    for (hsize_t i = 0; i < n; ++i) texts[i] = prompts[i].c_str();
    WD_CHECK_H5(H5Dwrite(prompts_ds.get(), str.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, texts.data()),
                path, kPrompts);
    if (classes) write_classes(file.get(), path, labels, patterns);
    progress.finish();
  }
  // With every object closed, H5Fclose writes the last metadata; a failure here (a full disk)
  // must not be ignored, so the file is closed explicitly rather than by the destructor.
  WD_CHECK_H5(H5Fclose(file.release()), path, "");
}

}  // namespace

void write_synthetic_dataset(const SyntheticDatasetSpec& spec) {
  check_spec(spec);
  TempFile tmp(spec.output);
  write_contents(tmp.path(), spec);
  tmp.commit();
  const auto& c = spec.latent;
  spdlog::info("make-dataset: wrote {} ({} samples, {}latents [{},{},{},{}] {}, context [{},{}], {}{})",
               spec.output, spec.samples, spec.contexts_only ? "contexts only, declared " : "", c[0], c[1], c[2], c[3],
               spec.half ? "float16" : "float32", spec.text_len, spec.text_dim,
               spec.condition == ImageCondition::kNone ? "" : std::string(name_of(spec.condition)) + " image condition, ",
               format_bytes(static_cast<double>(std::filesystem::file_size(spec.output))));
}

}  // namespace wd::data
