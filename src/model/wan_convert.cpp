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
#include <functional>
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

/// One DiT of the output: its checkpoint, the folder it goes into (relative to the output; empty
/// for the output itself), its config.json and its tensors' plans.
struct DitJob {
  const WanCheckpoint* input;
  fs::path sub;
  std::string config_json;
  std::vector<TensorPlan> plans;
  ConvertResult result;
};

/// The output directory, absolute; a ConfigError when it is empty, holds an input, or exists
/// without `force`.
fs::path checked_output(const std::vector<std::string>& inputs, const std::string& output, bool force) {
  fs::path out = fs::path(output).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();  // "dir/" names dir
  if (out.empty()) throw ConfigError("output() must name a directory");
  out = fs::absolute(out);
  for (const auto& input : inputs) {
    if (is_within(input, out)) {
      throw ConfigError("output(" + output + ") is or holds the input " + input + "; write the converted copy elsewhere");
    }
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

/// One tensor of `input` as `plan` writes it. A tensor written as stored is a view of the input
/// mapping, named in `written_as_views` so that its pages are dropped once its shard is on disk.
torch::Tensor convert_tensor(const WanCheckpoint& input, const TensorPlan& plan,
                             std::vector<std::string>& written_as_views) {
  const auto [file, stored] = input.location(plan.name);
  try {
    // A LoRA folder's adapted weight converts from its fp32 merge: the merge rounded to the
    // base's dtype first would lose what a wider output keeps (--dtype fp32 over a bf16 base).
    const bool merged = input.merges(plan.name);
    const auto source = merged ? input.tensor(plan.name, torch::kFloat) : input.tensor(plan.name);
    if (plan.from == plan.to && !merged) {
      written_as_views.push_back(plan.name);
      return source;
    }
    // Two reductions instead of an isfinite() pass: no temporary the size of the tensor, so
    // memory stays at one shard.
    const double largest = std::max(source.max().item<double>(), -source.min().item<double>());
    if (largest >= overflow_threshold(plan.to)) {
      throw DataError(file, stored, "holds " + std::to_string(largest) + ", beyond the range of " +
                                        dtype_name(plan.to) + " (it would become inf)");
    }
    auto converted = source.to(plan.to);
    input.release(plan.name);
    return converted;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw DataError(file, stored, std::string("cannot be converted to ") + dtype_name(plan.to) + ": " + e.what());
  }
}

/// Writes one DiT into `dir`: its config.json and its converted tensors, one shard at a time.
void write_dit(DitJob& job, const fs::path& dir, const ConvertOptions& options) {
  const auto& input = *job.input;
  fs::create_directories(dir);
  write_file_atomically((dir / "config.json").string(), job.config_json);
  Progress progress("converting " + input.path(), static_cast<double>(job.result.input_bytes), "bytes");
  std::vector<std::string> written_as_views;
  std::vector<TensorSource> sources;
  for (const auto& plan : job.plans) {
    const auto stored_as = options.layout == KeyLayout::kNative ? plan.name : native_to_diffusers(plan.name);
    sources.push_back({stored_as, plan.out_bytes, [&input, &progress, &written_as_views, plan] {
                         auto converted = convert_tensor(input, plan, written_as_views);
                         progress.advance(static_cast<double>(plan.in_bytes));
                         return converted;
                       }});
  }
  job.result.files = write_sharded_safetensors(
      dir.string(), kCheckpointStem, sources, options.shard_bytes, {{"format", "pt"}},
      [&input, &written_as_views](std::uint64_t) {
        for (const auto& name : written_as_views) input.release(name);
        written_as_views.clear();
        // The shard's tensors are freed by now, but glibc keeps freed heap memory below its
        // (self-raising, up to 32 MiB) mmap threshold: without a trim the resident set grows
        // with every shard (measured: 920 MiB instead of 330 MiB for 50 MB shards).
        ::malloc_trim(0);
      });
  progress.finish();
}

/// Converts each of `jobs` (input and subfolder set) into its subfolder of `output`, then lets
/// `finish` write what the folder holds beside them (a pipeline's model_index.json), all in a
/// staging directory published as `output` when complete. Every input is checked, and the
/// output and free space with it, before anything is written.
void convert_dits(std::vector<DitJob>& jobs, const std::string& output, const ConvertOptions& options,
                  const std::function<void(const fs::path&)>& finish) {
  std::vector<std::string> inputs;
  for (auto& job : jobs) {
    job.input->check();  // every missing, unexpected or mis-shaped tensor, named, before any work
    // The config first: it throws for a model the layout cannot express, before any work.
    job.config_json = wan_config_json(job.input->config(), options.layout);
    inputs.push_back(job.input->path());
  }
  const auto out = checked_output(inputs, output, options.force);
  const bool exists = fs::exists(fs::symlink_status(out));
  std::uint64_t out_bytes = 0;
  for (auto& job : jobs) job.plans = plan_tensors(*job.input, options, job.result, out_bytes);

  fs::create_directories(out.parent_path());
  const auto space = fs::space(out.parent_path());
  if (space.available < out_bytes) {
    throw Error("output(" + output + ") is on a file system with " + format_bytes(static_cast<double>(space.available)) +
                " free; the converted copy needs " + format_bytes(static_cast<double>(out_bytes)));
  }
  for (const auto& job : jobs) {
    const auto& r = job.result;
    spdlog::info("convert: {} ({}, {} layout{}) -> {} ({} layout) as {}{} in shards of at most {}", job.input->path(),
                 format_bytes(static_cast<double>(r.input_bytes)), layout_name(job.input->layout()),
                 job.input->prefixed() ? ", ComfyUI prefix" : "", (job.sub.empty() ? out : out / job.sub).string(),
                 layout_name(options.layout), dtype_name(options.dtype),
                 r.kept_fp32 ? fmt::format(" ({} fp32 tensors kept fp32)", r.kept_fp32) : "",
                 format_bytes(static_cast<double>(options.shard_bytes)));
  }
  StagingDir staging(out);
  std::size_t files = 0;
  std::uint64_t bytes = 0;
  for (auto& job : jobs) {
    write_dit(job, staging.path() / job.sub, options);
    files += job.result.files.shard_files.size() + (job.result.files.index_file.empty() ? 0 : 1);
    bytes += job.result.files.total_bytes;
  }
  // Last, so that the folder is what `finish` says it is only once its DiTs are complete.
  finish(staging.path());
  staging.publish(exists);
  spdlog::info("convert: wrote {} config.json and {} safetensors file(s) ({}) to {}", jobs.size(), files,
               format_bytes(static_cast<double>(bytes)), out.string());
}

}  // namespace

ConvertResult convert_wan_checkpoint(const WanCheckpoint& input, const std::string& output,
                                     const ConvertOptions& options) {
  WD_CHECK_AS(ConfigError, !options.pipeline || options.layout == KeyLayout::kDiffusers,
              "a diffusers pipeline folder holds the diffusers layout, not " << layout_name(options.layout));
  // A pipeline folder holds the DiT in transformer/, as diffusers' save_pretrained writes it.
  std::vector<DitJob> jobs(1);
  jobs[0].input = &input;
  if (options.pipeline) jobs[0].sub = DiffusersPipeline::kTransformer;
  convert_dits(jobs, output, options, [&](const fs::path& dir) {
    if (options.pipeline) write_diffusers_model_index(dir.string(), input.config(), false, std::nullopt);
  });
  return jobs[0].result;
}

std::array<ConvertResult, 2> convert_wan_experts(const WanExperts& experts, const std::string& output,
                                                 const ConvertOptions& options) {
  WD_CHECK_AS(ConfigError, experts.two_experts(), experts.path() << " is one model, not two experts");
  WD_CHECK_AS(ConfigError, options.pipeline || options.layout == KeyLayout::kNative,
              "the two experts of " << experts.path() << " make no single diffusers WanTransformer3DModel folder; "
                                    << "--layout pipeline writes them as a diffusers pipeline (transformer/ and "
                                       "transformer_2/, as Wan2.2-T2V-A14B-Diffusers), --layout native as the "
                                       "official high_noise_model/ and low_noise_model/");
  WD_CHECK_AS(ConfigError, !options.pipeline || options.layout == KeyLayout::kDiffusers,
              "a diffusers pipeline folder holds the diffusers layout, not " << layout_name(options.layout));
  std::vector<DitJob> jobs(2);
  jobs[0].input = &experts.expert(WanExperts::kLow);
  jobs[1].input = &experts.expert(WanExperts::kHigh);
  jobs[0].sub = options.pipeline ? DiffusersPipeline::kTransformer2 : WanExperts::kLowDir;
  jobs[1].sub = options.pipeline ? DiffusersPipeline::kTransformer : WanExperts::kHighDir;
  const auto& type = experts.config().model_type;
  if (!options.pipeline && default_expert_boundary(type) != experts.boundary()) {
    spdlog::warn("convert: the official two-expert layout records no boundary, and {}'s is {} where model type {}'s "
                 "default is {}: pass teacher.boundary {} wherever the output is used", experts.path(),
                 experts.boundary(), type, default_expert_boundary(type).value_or(0.0), experts.boundary());
  }
  convert_dits(jobs, output, options, [&](const fs::path& dir) {
    if (options.pipeline) write_diffusers_model_index(dir.string(), experts.config(), true, experts.boundary());
  });
  return {jobs[0].result, jobs[1].result};
}

}  // namespace wd
