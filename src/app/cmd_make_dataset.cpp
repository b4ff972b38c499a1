// `wan-distill make-dataset`: writes a synthetic HDF5 data set in the training schema.
#include <spdlog/spdlog.h>

#include "app/commands.hpp"
#include "core/logging.hpp"
#include "data/synthetic_dataset.hpp"

namespace wd::app {
namespace {

/// --dtype: the stored float type.
enum class StoredFloat { kFp32, kFp16 };
const std::vector<std::pair<StoredFloat, const char*>>& choices(StoredFloat) {
  static const std::vector<std::pair<StoredFloat, const char*>> names{{StoredFloat::kFp32, "fp32"},
                                                                       {StoredFloat::kFp16, "fp16"}};
  return names;
}

}  // namespace

int run_make_dataset(const std::vector<std::string>& args) {
  std::string output, latent = "16,3,16,16";
  StoredFloat dtype = StoredFloat::kFp32;
  DatasetKind kind = DatasetKind::kSmooth;
  std::int64_t samples = 64, text_len = 16, text_dim = 64, classes = 6;
  std::uint64_t seed = 0;
  bool contexts_only = false;
  ImageCondition condition = ImageCondition::kNone;
  LogConfig log;
  OptionTable table("make-dataset options");
  table.require("output", output, "HDF5 file to write")
      .bind("samples", samples, "number of samples N")
      .bind("latent", latent, "C,F,H,W of each latent")
      .bind("text-len", text_len, "context rows L (lengths vary in 1..L)")
      .bind("text-dim", text_dim, "context feature size")
      .bind("dtype", dtype, "stored float type")
      .bind("seed", seed, "generator seed")
      .bind("kind", kind,
            "smooth (random smooth latents, random contexts) or classes (a teacher can learn something: "
            "sample i is class i mod K, its class's smooth pattern shifted, moving, scaled and noised, with "
            "the class's context; writes /labels and /class_patterns; docs/objectives.md)")
      .bind("classes", classes, "kind classes: the number of classes K")
      .bind("contexts-only", contexts_only,
            "write no /latents, only the contexts (and classes) with the latent shape declared in the root "
            "attribute latent_shape: prompts without videos, what train.objective trajectory trains from")
      .bind("image-condition", condition,
            "write /condition, each sample's image condition: i2v (its first latent frame followed by zero "
            "frames, what an i2v teacher takes) or ti2v (its first latent frame; TI2V-5B's image mode)");
  log.bind(table);
  if (parse_options(args, table).help) {
    print_help("wan-distill make-dataset --output FILE [--samples N] [--latent C,F,H,W] [--text-len L] [--text-dim D]",
               "Writes a synthetic data set (docs/data-format.md): spatially smooth latents and\n"
               "context features of varied length, chunked per sample; with --kind classes, latents\n"
               "of K classes and one context per class, for the objectives' bench.",
               table);
    return kExitOk;
  }
  ConfigProblems p;
  p.check(samples >= 1, "samples(" + std::to_string(samples) + ") must be >= 1");
  p.check(text_len >= 1, "text-len(" + std::to_string(text_len) + ") must be >= 1");
  p.check(text_dim >= 1, "text-dim(" + std::to_string(text_dim) + ") must be >= 1");
  log.validate(p);
  p.throw_if_any("make-dataset");
  init_logging(Topology::single_process(), log.level);
  const auto dims = parse_dims(latent, 4, "latent");
  data::SyntheticDatasetSpec spec;
  spec.output = output;
  spec.samples = samples;
  spec.latent = {dims[0], dims[1], dims[2], dims[3]};
  spec.text_len = text_len;
  spec.text_dim = text_dim;
  spec.seed = seed;
  spec.half = dtype == StoredFloat::kFp16;
  spec.kind = kind;
  spec.classes = classes;
  spec.contexts_only = contexts_only;
  spec.condition = condition;
  data::write_synthetic_dataset(spec);
  spdlog::info("wrote {} ({} samples)", output, samples);
  return kExitOk;
}

}  // namespace wd::app
