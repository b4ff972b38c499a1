// TeacherStage: what one teacher rank computes for a batch: the whole DiT, or (shard) its
// pipeline stage's blocks; with one model or the two experts of an A14B teacher.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/guidance_scale.hpp"
#include "model/wan_checkpoint.hpp"
#include "model/wan_dit.hpp"
#include "teacher/block_streamer.hpp"
#include "teacher/host_arena.hpp"
#include "teacher/placement.hpp"

namespace wd::teacher {

/// One batch as it moves through the stages. Stage 0 fills the inputs; each stage replaces
/// `hidden` with the residual stream after its last block and adds the features it holds; the
/// last stage sets `out`.
struct StageBatch {
  torch::Tensor x_t;           ///< [B,C,F,H,W] fp32 noisy latents
  torch::Tensor t;             ///< [B] or [B,S] fp32 model timesteps
  torch::Tensor context;       ///< [B,L,text_dim] fp32
  torch::Tensor context_lens;  ///< [B] int64
  /// An i2v teacher's image condition y [B, 4 + C, F, H, W] fp32 (i2v_condition: the mask and
  /// the image latents), concatenated after x_t at every forward; undefined otherwise.
  torch::Tensor y;
  torch::Tensor hidden;        ///< [B,S,dim] fp32 after the previous stage; undefined on stage 0
  std::map<std::int64_t, torch::Tensor> features;  ///< block -> [B,S,dim] fp32
  torch::Tensor out;           ///< [B,out_dim,F,H,W] fp32, set by the last stage
  torch::Tensor start;         ///< trajectory with plan.start_states: [B,C,F,H,W] each path's noise

  /// A forward's inputs as a message or request carries them: x_t, t, context, context_lens, and
  /// y when there is one (an i2v teacher's condition). The tensors are those of `m`, not copies.
  static StageBatch inputs_of(const std::map<std::string, torch::Tensor>& m);
};

/// One expert's model on this rank, with its streamer when the placement is `stream`.
struct StageModel {
  WanDiT model;
  /// stream: the node's arena the blocks are copied from; null where they come from the mapped
  /// checkpoint. Declared before the streamer, so it goes after the streamer's copies drained.
  std::unique_ptr<HostArena> arena;
  std::unique_ptr<BlockStreamer> streamer;  ///< null unless teacher.placement = stream
  /// stream: where the blocks come from, as logged ("pinned arena ..." or "mapped checkpoint, N
  /// copy threads (why no arena)").
  std::string stream_source;
};

/// How one rank loads its model (one expert's, for an A14B teacher).
struct StageLoad {
  plan::Placement placement = plan::Placement::kCpu;
  std::optional<c10::ScalarType> dtype;  ///< nullopt = each tensor as stored (teacher.dtype auto)
  c10::Device device = torch::kCPU;
  BlockRange blocks;                     ///< all blocks unless shard
  int stream_ahead = 2;
  double timeout_s = 120;                ///< deadline of a streamed block's copy (and the arena's fill)
  /// stream: the teacher ranks whose node-mates share one arena (MPI_Comm_split_type SHARED of
  /// it); MPI_COMM_NULL: this rank alone.
  MPI_Comm arena_group = MPI_COMM_NULL;
  /// stream: the most bytes the node's arena may take (0: no arena); nullopt = measured
  /// (plan::kArenaShareOfAvailable of MemAvailable on the node's first teacher rank).
  std::optional<std::uint64_t> arena_limit;
  int copy_threads = 4;                  ///< stream without the arena: staging threads
  std::string arena_tag = "teacher";     ///< tells one job's segments apart (each expert its own)
};

/// Loads the model for `how`: gpu/cpu/shard bind (or convert) only the blocks in `how.blocks`
/// plus the embeddings and head on the device; stream keeps the blocks mapped on the host and
/// builds the streamer. Frozen (no grad).
StageModel load_stage_model(const WanCheckpoint& checkpoint, const StageLoad& how);

/// Bytes this rank holds for the teacher: its parameters, or for stream the embeddings/head
/// plus the device slots (the mapped blocks live in the page cache).
std::uint64_t stage_weight_bytes(const StageModel& m);

/// Sample indices per expert for timesteps `t` (one list per expert, in expert order).
using Router = std::function<std::vector<std::vector<std::int64_t>>(const torch::Tensor& t)>;

class TeacherStage {
 public:
  /// `experts` holds one model, or several with `router` choosing each sample's expert.
  TeacherStage(std::vector<StageModel> experts, Router router, BlockRange blocks,
               std::vector<std::int64_t> feature_blocks);

  /// Runs this stage on `batch` (no grad): embeddings (stage 0) or the received hidden state,
  /// blocks [begin, end), then the head when the stage ends at the last block.
  /// With a micro-batch set, the batch runs in slices of that many samples and the results are
  /// concatenated: the same values as one forward (every op is per sample), less working memory.
  void run(StageBatch& batch);
  /// Samples per forward (teacher.micro_batch); 0 = the whole batch at once.
  void set_micro_batch(std::int64_t samples) { micro_batch_ = samples; }
  /// train.objective guided: every run() computes each sample twice in one batch, with its own
  /// context and with `negative` ([L',text_dim] on the host; undefined: zeros of the sample's
  /// context width, all rows valid, as `sample --guidance` without --negative), and sets
  /// out = v_neg + g·(v_cond − v_neg); the features are the conditional pass's. A whole model
  /// only (one stage holding every block). A per-expert `g` (GuidanceScale::per_expert) needs
  /// two experts: each sample takes the scale of the expert its t routes it to.
  void set_guidance(const GuidanceScale& g, torch::Tensor negative = {});
  bool guided() const { return guided_; }

  const BlockRange& blocks() const { return blocks_; }
  bool first() const { return blocks_.begin == 0; }
  bool last() const { return blocks_.end == num_layers_; }
  const std::vector<StageModel>& experts() const { return experts_; }
  /// Feature blocks whose hidden states leave this stage (held here or by earlier stages).
  std::vector<std::int64_t> features_after() const { return features_before(feature_blocks_, blocks_.end); }
  /// The feature blocks before block `end`.
  static std::vector<std::int64_t> features_before(const std::vector<std::int64_t>& features, std::int64_t end);

 private:
  /// Per-expert guidance: the scale of each sample of `like` [B,...] at timesteps `t`, [B,1,...],
  /// by the expert the router sends it to.
  torch::Tensor sample_scales(const torch::Tensor& t, const torch::Tensor& like) const;
  /// run() without guidance: in micro-batches where set.
  void run_plain(StageBatch& batch);
  /// One forward of the whole `batch` (its experts' shares routed and merged).
  void run_batch(StageBatch& batch);
  /// The whole forward of `samples` (all of the batch, or one expert's share) on one model.
  void run_model(StageModel& m, StageBatch& batch, const std::vector<std::int64_t>* samples,
                 torch::Tensor& result, std::map<std::int64_t, torch::Tensor>& features);

  std::vector<StageModel> experts_;
  Router router_;
  BlockRange blocks_;
  std::int64_t num_layers_;
  std::vector<std::int64_t> feature_blocks_;
  std::int64_t micro_batch_ = 0;
  bool guided_ = false;
  GuidanceScale guidance_;  ///< set_guidance's scale (guided_)
  torch::Tensor negative_;  ///< [L',text_dim] fp32 on the host; undefined: zeros
};

}  // namespace wd::teacher
