// A teacher rank's share of the forward: embeddings, its blocks, the head.
#include "teacher/teacher_stage.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "core/errors.hpp"
#include "core/logging.hpp"
#include "memory/host_memory.hpp"
#include "memory/memory_report.hpp"

namespace wd::teacher {

StageBatch StageBatch::inputs_of(const std::map<std::string, torch::Tensor>& m) {
  const auto at = [&](const char* name) -> const torch::Tensor& {
    const auto it = m.find(name);
    WD_CHECK(it != m.end(), "a teacher forward's inputs lack " << name);
    return it->second;
  };
  StageBatch b;
  b.x_t = at("x_t");
  b.t = at("t");
  b.context = at("context");
  b.context_lens = at("context_lens");
  if (const auto y = m.find("y"); y != m.end()) b.y = y->second;
  return b;
}

namespace {

/// The most bytes the node's arena may take, and what set it.
std::pair<std::uint64_t, std::string> arena_limit(const StageLoad& how) {
  if (how.arena_limit) return {*how.arena_limit, "teacher.arena_limit"};
  const auto available = memory::host_available_bytes();
  return {static_cast<std::uint64_t>(plan::kArenaShareOfAvailable * static_cast<double>(available)),
          fmt::format("{:.0f}% of MemAvailable {}", 100 * plan::kArenaShareOfAvailable,
                      format_bytes(static_cast<double>(available)))};
}

/// The copy engine for where the blocks come from and where they go: one DMA per block from a
/// pinned arena; staging on the copy threads from pageable memory (the mapped checkpoint, or an
/// arena CUDA would not register); the host "device" of the CPU build copies on the same threads.
std::unique_ptr<CopyEngine> copy_engine(const StageLoad& how, std::size_t slots, const HostArena* arena) {
  const int threads = arena ? 1 : how.copy_threads;  // an arena block is one contiguous copy
  if (!how.device.is_cuda()) return make_host_copy_engine(slots, how.timeout_s, threads);
  if (arena && arena->pinned()) return make_cuda_direct_copy_engine(slots, how.device);
  return make_cuda_copy_engine(slots, how.device, how.timeout_s, how.copy_threads);
}

/// The node's arena of `model`'s blocks in `dtypes` (one copy per node, filled by its first
/// teacher rank), pinned for a CUDA device; null where it does not fit or could not be made,
/// with `source` saying where the blocks come from instead.
std::unique_ptr<HostArena> open_arena(WanDiT& model, const StageLoad& how, const std::vector<c10::ScalarType>& dtypes,
                                      std::string& source) {
  std::uint64_t block_bytes = 0;
  BlockStreamer::block_layout(model->block_parameters(how.blocks.begin), dtypes, block_bytes);
  const auto bytes = block_bytes * static_cast<std::uint64_t>(how.blocks.size());
  const auto [limit, limit_source] = arena_limit(how);
  const auto fallback = fmt::format("mapped checkpoint, {} copy thread(s)", how.copy_threads);
  if (limit == 0) {
    source = fallback + " (teacher.arena_limit 0: no arena)";
    return nullptr;
  }
  std::string why;
  auto arena = HostArena::create(
      how.arena_group, how.arena_tag, bytes, limit,
      [&](std::uint8_t* data) {
        BlockStreamer::write_arena(model, how.blocks.begin, how.blocks.end, dtypes, data, how.copy_threads);
      },
      how.timeout_s, why);
  if (!arena) {
    source = fmt::format("{}: no pinned arena ({}; {})", fallback, why, limit_source);
    return nullptr;
  }
  std::string pin = "pinned";
  if (how.device.is_cuda() && !arena->pin_for_cuda(why)) {
    pin = "not pinned (" + why + "), so staged on " + std::to_string(how.copy_threads) + " copy thread(s)";
  }
  source = fmt::format("{} arena {} of {} shared by {} teacher rank(s) of this node ({}), one copy per block",
                       how.device.is_cuda() ? pin : std::string("host"), arena->name(),
                       format_bytes(static_cast<double>(bytes)), arena->node_ranks(),
                       arena->filled_here() ? "filled here" : "mapped, filled by the node's first teacher rank");
  return arena;
}

/// Stream: every tensor first bound zero-copy to the mapping; the embeddings and head then go
/// to the device for good, the blocks go to the node's arena (or stay mapped) and are copied
/// slot by slot.
StageModel load_streamed(const WanCheckpoint& ck, const StageLoad& how) {
  const std::pair<std::int64_t, std::int64_t> range{how.blocks.begin, how.blocks.end};
  auto model = load_wan_dit(ck, std::nullopt, torch::kCPU, range);
  torch::NoGradGuard no_grad;
  for (const auto& spec : wan_param_specs(ck.config())) {
    if (wan_block_of(spec.name) >= 0) continue;
    model->bind_parameter(spec.name, ck.tensor(spec.name, how.dtype, how.device));
  }
  std::vector<c10::ScalarType> dtypes;
  for (const auto& p : model->block_parameters(how.blocks.begin)) {
    dtypes.push_back(how.dtype ? *how.dtype : p.scalar_type());
  }
  StageModel out{model, nullptr, nullptr, ""};
  out.arena = open_arena(model, how, dtypes, out.stream_source);
  const auto slots = BlockStreamer::slots_for(how.stream_ahead, how.blocks.size());
  out.streamer = std::make_unique<BlockStreamer>(model, how.blocks.begin, how.blocks.end, how.stream_ahead, how.device,
                                                 dtypes, copy_engine(how, slots, out.arena.get()),
                                                 out.arena ? out.arena->data() : nullptr);
  const auto line = fmt::format("stream: blocks {}-{} from the {}; {} buffers of {} on {}", how.blocks.begin,
                                how.blocks.end - 1, out.stream_source, slots,
                                format_bytes(static_cast<double>(out.streamer->block_bytes())), how.device.str());
  // No arena where one was wanted is slower (the copy threads stage every block): a warning.
  if (out.arena || how.arena_limit == std::optional<std::uint64_t>(0)) {
    spdlog::info(line);
  } else {
    spdlog::warn(line);
  }
  return out;
}

}  // namespace

StageModel load_stage_model(const WanCheckpoint& ck, const StageLoad& how) {
  if (how.placement != plan::Placement::kStream) {
    const std::pair<std::int64_t, std::int64_t> range{how.blocks.begin, how.blocks.end};
    return {load_wan_dit(ck, how.dtype, how.device, range), nullptr, nullptr, ""};
  }
  return load_streamed(ck, how);
}

std::uint64_t stage_weight_bytes(const StageModel& m) {
  if (!m.streamer) return memory::tensor_bytes(m.model->parameters());
  std::uint64_t bytes = m.streamer->buffer_bytes();
  for (const auto& item : m.model->named_parameters()) {
    const auto& p = item.value();
    if (wan_block_of(item.key()) < 0) bytes += static_cast<std::uint64_t>(p.numel() * p.element_size());
  }
  return bytes;
}

TeacherStage::TeacherStage(std::vector<StageModel> experts, Router router, BlockRange blocks,
                           std::vector<std::int64_t> feature_blocks)
    : experts_(std::move(experts)),
      router_(std::move(router)),
      blocks_(blocks),
      feature_blocks_(std::move(feature_blocks)) {
  WD_CHECK(!experts_.empty(), "a teacher stage needs a model");
  WD_CHECK(experts_.size() == 1 || router_, "a teacher with " << experts_.size() << " experts needs a router");
  num_layers_ = experts_.front().model->config().num_layers;
  WD_CHECK(blocks_.begin >= 0 && blocks_.end > blocks_.begin && blocks_.end <= num_layers_,
           "teacher stage blocks [" << blocks_.begin << ", " << blocks_.end << ") outside 0.." << num_layers_);
}

std::vector<std::int64_t> TeacherStage::features_before(const std::vector<std::int64_t>& features,
                                                        std::int64_t end) {
  std::vector<std::int64_t> out;
  for (const auto j : features) {
    if (j < end) out.push_back(j);
  }
  return out;
}

void TeacherStage::run_model(StageModel& m, StageBatch& b, const std::vector<std::int64_t>* samples,
                             torch::Tensor& result, std::map<std::int64_t, torch::Tensor>& features) {
  const auto pick = [&](const torch::Tensor& x) {
    if (!samples) return x;
    return x.index_select(0, torch::tensor(*samples, torch::TensorOptions().dtype(torch::kLong).device(x.device())));
  };
  auto& model = m.model;
  // Every stage embeds its own copy of the inputs: the time projection and the embedded text
  // are recomputed here rather than sent, which costs little next to a block and keeps the
  // stage message to the inputs and one hidden state.
  auto state = model->embed(WanInputs::batched(pick(b.x_t), pick(b.t), pick(b.context), pick(b.context_lens), 0,
                                               b.y.defined() ? pick(b.y) : b.y));
  if (!first()) {
    WD_CHECK(b.hidden.defined(), "stage starting at block " << blocks_.begin << " got no hidden state");
    // The residual stream is fp32 from block 0 on (spec §6), so the received copy is exact.
    state.x = pick(b.hidden).to(state.x.device());
  }
  for (std::int64_t i = blocks_.begin; i < blocks_.end; ++i) {
    if (m.streamer) m.streamer->before(i);
    model->run_block(i, state);
    if (m.streamer) m.streamer->after(i);
    if (std::find(feature_blocks_.begin(), feature_blocks_.end(), i) != feature_blocks_.end()) {
      features[i] = state.x.to(torch::kFloat);
    }
  }
  result = last() ? torch::stack(model->unembed(state)) : state.x.to(torch::kFloat);
}

void TeacherStage::set_guidance(const GuidanceScale& g, torch::Tensor negative) {
  WD_CHECK_AS(ConfigError, first() && last(),
              "teacher.guidance needs the whole teacher on one rank; this stage holds blocks "
                  << blocks_.begin << "-" << blocks_.end - 1 << " of " << num_layers_);
  WD_CHECK_AS(ConfigError, g.low > 0 && g.high > 0, "teacher.guidance(" << g.str() << ") must be > 0");
  WD_CHECK_AS(ConfigError, !g.per_expert() || experts_.size() == 2,
              "teacher.guidance(" << g.str() << ") gives each expert of a two-expert teacher its own scale; this "
                                  << "teacher has one: give one scale");
  guided_ = true;
  guidance_ = g;
  negative_ = negative.defined() ? negative.to(torch::kFloat).cpu() : negative;
}

void TeacherStage::run(StageBatch& b) {
  if (!guided()) {
    run_plain(b);
    return;
  }
  // [cond; neg] as one batch: the negative context padded (or the contexts) to one width, each
  // half with its own lengths.
  const auto B = b.x_t.size(0);
  const auto& ctx = b.context;
  auto neg = negative_.defined() ? negative_.to(ctx.device()).unsqueeze(0).expand({B, -1, -1})
                                 : torch::zeros_like(ctx);
  const auto width = std::max(ctx.size(1), neg.size(1));
  const auto pad = [width](const torch::Tensor& c) { return torch::constant_pad_nd(c, {0, 0, 0, width - c.size(1)}); };
  StageBatch both;
  both.x_t = torch::cat({b.x_t, b.x_t});
  both.t = torch::cat({b.t, b.t});
  if (b.y.defined()) both.y = torch::cat({b.y, b.y});  // the negative forward takes the image too
  both.context = torch::cat({pad(ctx), pad(neg)});
  both.context_lens =
      torch::cat({b.context_lens, torch::full({B}, neg.size(1), b.context_lens.options())});
  run_plain(both);
  const auto cond = both.out.slice(0, 0, B), uncond = both.out.slice(0, B);
  b.out = guidance_.per_expert() ? uncond + sample_scales(b.t, cond) * (cond - uncond)
                                 : uncond + guidance_.low * (cond - uncond);
  for (const auto& [j, h] : both.features) b.features[j] = h.slice(0, 0, B);
}

torch::Tensor TeacherStage::sample_scales(const torch::Tensor& t, const torch::Tensor& like) const {
  // Each sample's expert, as run_batch routes it: routes[1] is the high-noise expert's.
  const auto routes = router_(t);
  auto g = torch::full({like.size(0)}, guidance_.low, torch::kFloat);
  for (const auto i : routes.at(1)) g[i] = guidance_.high;
  std::vector<std::int64_t> shape(static_cast<std::size_t>(like.dim()), 1);
  shape[0] = like.size(0);
  return g.to(like.options()).view(shape);
}

void TeacherStage::run_plain(StageBatch& b) {
  const auto B = b.x_t.size(0);
  if (micro_batch_ <= 0 || B <= micro_batch_) {
    run_batch(b);
    return;
  }
  const auto slice = [](const torch::Tensor& t, std::int64_t lo, std::int64_t hi) {
    return t.defined() ? t.slice(0, lo, hi) : t;
  };
  std::vector<StageBatch> parts;
  for (std::int64_t lo = 0; lo < B; lo += micro_batch_) {
    const auto hi = std::min(B, lo + micro_batch_);
    StageBatch part;
    part.x_t = slice(b.x_t, lo, hi);
    part.t = slice(b.t, lo, hi);
    part.context = slice(b.context, lo, hi);
    part.context_lens = slice(b.context_lens, lo, hi);
    part.y = slice(b.y, lo, hi);
    part.hidden = slice(b.hidden, lo, hi);
    for (const auto& [j, h] : b.features) part.features[j] = slice(h, lo, hi);
    run_batch(part);
    parts.push_back(std::move(part));
  }
  const auto gather = [&](const auto& field) {
    std::vector<torch::Tensor> pieces;
    for (const auto& part : parts) pieces.push_back(field(part));
    return torch::cat(pieces, 0);
  };
  if (last()) {
    b.out = gather([](const StageBatch& part) { return part.out; });
  } else {
    b.hidden = gather([](const StageBatch& part) { return part.hidden; });
  }
  for (const auto& [j, h] : parts.front().features) {
    b.features[j] = gather([j = j](const StageBatch& part) { return part.features.at(j); });
  }
}

void TeacherStage::run_batch(StageBatch& b) {
  torch::NoGradGuard no_grad;
  if (experts_.size() == 1) {
    torch::Tensor result;
    std::map<std::int64_t, torch::Tensor> features;
    run_model(experts_.front(), b, nullptr, result, features);
    // Results stay on the stage's device: the transport moves them (NCCL or a host copy).
    for (auto& [j, h] : features) b.features[j] = h;
    (last() ? b.out : b.hidden) = result;
    return;
  }
  // Experts: each runs on its own samples; the results go back to their batch positions.
  const auto routes = router_(b.t);
  WD_CHECK(routes.size() == experts_.size(), "the router gave " << routes.size() << " routes for "
                                                                << experts_.size() << " experts");
  torch::Tensor merged;
  std::map<std::int64_t, torch::Tensor> merged_features;
  const auto B = b.x_t.size(0);
  for (std::size_t e = 0; e < experts_.size(); ++e) {
    if (routes[e].empty()) continue;
    torch::Tensor result;
    std::map<std::int64_t, torch::Tensor> features;
    run_model(experts_[e], b, &routes[e], result, features);
    const auto idx = torch::tensor(routes[e], torch::TensorOptions().dtype(torch::kLong).device(result.device()));
    const auto place = [&](torch::Tensor& into, const torch::Tensor& p) {
      if (!into.defined()) {
        auto shape = p.sizes().vec();
        shape[0] = B;
        into = torch::zeros(shape, p.options());
      }
      into.index_copy_(0, idx, p);
    };
    place(merged, result);
    for (auto& [j, h] : features) place(merged_features[j], h);
  }
  for (auto& [j, h] : merged_features) b.features[j] = h;
  (last() ? b.out : b.hidden) = merged;
}

}  // namespace wd::teacher
