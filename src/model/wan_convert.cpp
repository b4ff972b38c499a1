// Streaming dtype / layout conversion of Wan DiT checkpoints into an atomically published directory.
#include "model/wan_convert.hpp"

#include "model/diffusers_pipeline.hpp"
#include "model/wan_keys.hpp"

#include <fcntl.h>
#include <malloc.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "core/errors.hpp"
#include "core/logging.hpp"

namespace wd {

namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // durability hint only; the files themselves are already synced
  (void)::fsync(fd);
  ::close(fd);
}

/// A directory beside the output that the converted files are written into. It is removed on
/// destruction unless publish() has moved it to its final name, so every failure path (an
/// exception anywhere in the conversion) leaves nothing behind.
class StagingDir {
 public:
  explicit StagingDir(const fs::path& output)
      : output_(output),
        path_(output.parent_path() /
              ("." + output.filename().string() + ".partial-" + std::to_string(::getpid()))) {
    std::error_code ec;
    fs::remove_all(path_, ec);  // left by an earlier run of this same pid (after a crash)
    fs::create_directories(path_, ec);
    if (ec) throw SystemError("cannot create " + path_.string() + ": " + ec.message());
  }
  ~StagingDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);  // after publish() this is the replaced output, or nothing
  }
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;

  const fs::path& path() const { return path_; }

  /// Renames the staging directory to the output; with `replace`, atomically swaps it with the
  /// existing output, whose old contents the destructor then removes.
  void publish(bool replace) {
    const unsigned flags = replace ? RENAME_EXCHANGE : RENAME_NOREPLACE;
    if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, output_.c_str(), flags) != 0) {
      const int err = errno;
      if (err != EINVAL && err != ENOSYS) {
        throw SystemError("cannot rename " + path_.string() + " to " + output_.string() + ": " +
                          std::strerror(err));
      }
      publish_without_renameat2(replace);
    }
    sync_directory(output_.parent_path());
  }

 private:
  // File systems without renameat2 flags: move the old output aside first (not atomic, but
  // the old copy survives until the new one is in place).
  void publish_without_renameat2(bool replace) {
    std::error_code ec;
    const fs::path old = path_.string() + ".old";
    if (replace) {
      fs::rename(output_, old, ec);
      if (ec) throw SystemError("cannot move " + output_.string() + " aside: " + ec.message());
    } else if (fs::exists(fs::symlink_status(output_))) {
      throw ConfigError("output(" + output_.string() + ") appeared while converting; not replaced");
    }
    fs::rename(path_, output_, ec);
    if (ec) {
      if (replace) fs::rename(old, output_, ec);
      throw SystemError("cannot rename " + path_.string() + " to " + output_.string() + ": " +
                        ec.message());
    }
    path_ = old;
  }

  fs::path output_;
  fs::path path_;
};

/// Whether `inner` is `outer` or lies inside it (both made absolute, symlinks resolved).
bool is_within(const fs::path& inner, const fs::path& outer) {
  std::error_code ec;
  const auto a = fs::weakly_canonical(inner, ec);
  const auto b = fs::weakly_canonical(outer, ec);
  auto it = a.begin();
  for (const auto& part : b) {
    if (part.empty()) continue;  // trailing separator
    if (it == a.end() || *it != part) return false;
    ++it;
  }
  return true;
}

/// The smallest magnitude that rounds to inf in `dtype` (its largest finite value plus half an
/// ulp); infinity for types no fp32 value can overflow.
double overflow_threshold(c10::ScalarType dtype) {
  switch (dtype) {
    case torch::kHalf:
      return 65520.0;  // 65504 + 16
    case torch::kBFloat16:
      return 3.3961775292304005e38;  // (2 - 2^-8) * 2^127
    default:
      return std::numeric_limits<double>::infinity();
  }
}

}  // namespace

bool kept_in_fp32(const std::string& key) {
  if (starts_with(key, "time_embedding.") || starts_with(key, "time_projection.") ||
      starts_with(key, "head.head.") || key == "head.modulation") {
    return true;
  }
  return starts_with(key, "blocks.") && (ends_with(key, ".modulation") || key.find(".norm3.") != std::string::npos);
}

namespace {

/// One tensor's conversion: its stored and written dtypes and sizes.
struct TensorPlan {
  std::string name;
  c10::ScalarType from, to;
  std::uint64_t in_bytes, out_bytes;
};

/// The output directory, absolute; a ConfigError when it is empty, holds the input, or exists
/// without `force`.
fs::path checked_output(const WanCheckpoint& input, const std::string& output, bool force) {
  fs::path out = fs::path(output).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();  // "dir/" names dir
  if (out.empty()) throw ConfigError("output() must name a directory");
  out = fs::absolute(out);
  if (is_within(input.path(), out)) {
    throw ConfigError("output(" + output + ") is or holds the input " + input.path() +
                      "; write the converted copy elsewhere");
  }
  if (fs::exists(fs::symlink_status(out)) && !force) {
    throw ConfigError("output(" + output + ") already exists; pass --force to replace it");
  }
  return out;
}

/// Every tensor's plan, in the model's order; counts the input bytes and the fp32 tensors kept
/// into `result` and the bytes to write into `out_bytes`.
std::vector<TensorPlan> plan_tensors(const WanCheckpoint& input, const ConvertOptions& options, ConvertResult& result,
                                     std::uint64_t& out_bytes) {
  std::vector<TensorPlan> plans;
  for (const auto& spec : wan_param_specs(input.config())) {
    const auto& info = input.info(spec.name);
    const auto from = safetensors_to_scalar_type(info.dtype);
    const bool keep = options.keep_fp32 && from == torch::kFloat && kept_in_fp32(spec.name);
    const auto to = keep ? torch::kFloat : options.dtype;
    const auto written = static_cast<std::uint64_t>(spec.numel()) * c10::elementSize(to);
    plans.push_back({spec.name, from, to, info.nbytes(), written});
    result.input_bytes += info.nbytes();
    out_bytes += written;
    if (keep && options.dtype != torch::kFloat) {
      result.kept_fp32 += 1;
      result.kept_fp32_bytes += info.nbytes();
    }
  }
  result.tensors = plans.size();
  return plans;
}

}  // namespace

ConvertResult convert_wan_checkpoint(const WanCheckpoint& input, const std::string& output,
                                     const ConvertOptions& options) {
  input.check();  // every missing, unexpected or mis-shaped tensor, named, before any work
  WD_CHECK_AS(ConfigError, !options.pipeline || options.layout == KeyLayout::kDiffusers,
              "a diffusers pipeline folder holds the diffusers layout, not " << layout_name(options.layout));
  // The config first: it throws for a model the layout cannot express, before any work.
  const auto config_json = wan_config_json(input.config(), options.layout);
  const auto out = checked_output(input, output, options.force);
  const bool exists = fs::exists(fs::symlink_status(out));
  ConvertResult result;
  std::uint64_t out_bytes = 0;
  const auto plans = plan_tensors(input, options, result, out_bytes);

  fs::create_directories(out.parent_path());
  const auto space = fs::space(out.parent_path());
  if (space.available < out_bytes) {
    throw Error("output(" + output + ") is on a file system with " +
                format_bytes(static_cast<double>(space.available)) + " free; the converted copy needs " +
                format_bytes(static_cast<double>(out_bytes)));
  }
  spdlog::info("convert: {} ({}, {} layout{}) -> {} ({} layout) as {}{} in shards of at most {}",
               input.path(), format_bytes(static_cast<double>(result.input_bytes)),
               layout_name(input.layout()), input.prefixed() ? ", ComfyUI prefix" : "",
               out.string(), layout_name(options.layout), dtype_name(options.dtype),
               result.kept_fp32 ? fmt::format(" ({} fp32 tensors kept fp32)", result.kept_fp32) : "",
               format_bytes(static_cast<double>(options.shard_bytes)));

  StagingDir staging(out);
  // A pipeline folder holds the DiT in transformer/, as diffusers' save_pretrained writes it.
  const auto dit_dir = options.pipeline ? staging.path() / DiffusersPipeline::kTransformer : staging.path();
  fs::create_directories(dit_dir);
  write_file_atomically((dit_dir / "config.json").string(), config_json);

  Progress progress("converting " + input.path(), static_cast<double>(result.input_bytes), "bytes");
  // Tensors written as they are stored are views of the input mapping: their pages can only be
  // dropped once their shard is on disk.
  std::vector<std::string> written_as_views;
  std::vector<TensorSource> sources;
  for (const auto& plan : plans) {
    const auto stored_as =
        options.layout == KeyLayout::kNative ? plan.name : native_to_diffusers(plan.name);
    sources.push_back({stored_as, plan.out_bytes, [&input, &progress, &written_as_views, plan] {
                         const auto [file, stored] = input.location(plan.name);
                         torch::Tensor converted;
                         try {
                           // A LoRA folder's adapted weight converts from its fp32 merge:
                           // the merge rounded to the base's dtype first would lose what a
                           // wider output keeps (--dtype fp32 over a bf16 base).
                           const bool merged = input.merges(plan.name);
                           const auto source = merged ? input.tensor(plan.name, torch::kFloat) : input.tensor(plan.name);
                           if (plan.from == plan.to && !merged) {
                             converted = source;
                             written_as_views.push_back(plan.name);
                           } else {
                             // Two reductions instead of an isfinite() pass: no temporary
                             // the size of the tensor, so memory stays at one shard.
                             const double largest = std::max(source.max().item<double>(),
                                                             -source.min().item<double>());
                             if (largest >= overflow_threshold(plan.to)) {
                               throw DataError(file, stored,
                                               "holds " + std::to_string(largest) +
                                                   ", beyond the range of " + dtype_name(plan.to) +
                                                   " (it would become inf)");
                             }
                             converted = source.to(plan.to);
                             input.release(plan.name);
                           }
                         } catch (const Error&) {
                           throw;
                         } catch (const std::exception& e) {
                           throw DataError(file, stored, std::string("cannot be converted to ") +
                                                             dtype_name(plan.to) + ": " + e.what());
                         }
                         progress.advance(static_cast<double>(plan.in_bytes));
                         return converted;
                       }});
  }
  result.files = write_sharded_safetensors(
      dit_dir.string(), kCheckpointStem, sources, options.shard_bytes, {{"format", "pt"}},
      [&input, &written_as_views](std::uint64_t) {
        for (const auto& name : written_as_views) input.release(name);
        written_as_views.clear();
        // The shard's tensors are freed by now, but glibc keeps freed heap memory below its
        // (self-raising, up to 32 MiB) mmap threshold: without a trim the resident set grows
        // with every shard (measured: 920 MiB instead of 330 MiB for 50 MB shards).
        ::malloc_trim(0);
      });
  progress.finish();
  // Last, so that the folder is a pipeline only once its transformer is complete.
  if (options.pipeline) write_diffusers_model_index(staging.path().string(), input.config(), false, std::nullopt);
  staging.publish(exists);
  spdlog::info("convert: wrote {}config.json, {} safetensors file(s){} ({}) to {}",
               options.pipeline ? std::string(DiffusersPipeline::kIndexName) + " and transformer/" : "",
               result.files.shard_files.size(),
               result.files.index_file.empty() ? "" : " and " + result.files.index_file,
               format_bytes(static_cast<double>(result.files.total_bytes)), out.string());
  return result;
}

}  // namespace wd
