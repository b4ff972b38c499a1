// Memory planner: predicts each rank's memory for every teacher placement from the model shapes,
// the batch, the latent size and the dtypes, before anything is loaded (docs/placement.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace wd::plan {

/// Where the frozen teacher's weights live and where it computes (teacher.placement).
enum class Placement { kGpu, kCpu, kStream, kShard };
std::string placement_name(Placement p);
/// gpu, cpu, stream, shard: the table's order.
const std::vector<Placement>& all_placements();

/// What memory depends on in one DiT (a WanConfig reduced to numbers; the caller fills it).
struct DitShape {
  std::int64_t dim = 0;
  std::int64_t ffn_dim = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_layers = 0;
  std::int64_t freq_dim = 0;
  std::int64_t block_params = 0;  ///< parameters of one block
  std::int64_t other_params = 0;  ///< embeddings and head
  std::int64_t experts = 1;       ///< MoE experts held together (Wan 2.2 A14B: 2)
  std::int64_t head_dim() const { return dim / num_heads; }
  std::int64_t params() const { return experts * (other_params + num_layers * block_params); }
};

/// Everything the prediction depends on. Bytes are per rank unless named otherwise.
struct PlanInput {
  DitShape teacher;
  DitShape student;
  /// train.objective dmd: the critic's shape, for its activations (num_layers 0: no dmd). It
  /// trains in its own update, after the generator's graph is gone; its GAN step
  /// (`critic_classifies`, critic.gan_weight) holds real and fake, twice the batch; with
  /// `critic_in_generator_graph` (the generator's GAN term, train.gan_weight) the generator's
  /// loss also runs through it while the generator's graph is held.
  DitShape critic;
  bool critic_classifies = false;
  bool critic_in_generator_graph = false;
  std::int64_t teacher_elem_bytes = 2;     ///< teacher.dtype: bf16/fp16 2, fp32 4
  std::int64_t checkpoint_elem_bytes = 2;  ///< as stored; another dtype is converted at load
  bool student_bf16_mixed = false;         ///< student.precision = bf16-mixed
  bool student_ema = false;                ///< train.ema_decay > 0: an fp32 weight average
  /// student.shard optimizer: each student rank keeps AdamW moments for 1/student_ranks of the
  /// parameters (the dmd critic's too); the weight average stays whole.
  bool shard_optimizer = false;
  /// student.shard gradients (with shard_optimizer): each student rank keeps the averaged
  /// gradients of its slice only; the full gradients exist a bucket at a time in the backward.
  bool shard_gradients = false;
  /// student.shard parameters (with both above): each student rank keeps the fp32 weights of its
  /// slice too; the blocks are gathered one at a time for each use, the rest (embeddings, head,
  /// distillation heads, a dmd critic's) stays whole.
  bool shard_parameters = false;
  /// GPU students' student.shard collectives over NCCL (comm.backend auto or nccl: each student
  /// on a GPU of its own): the packed buckets and the all-gather's buffer on the device, no host
  /// copy. False: over MPI, through host memory.
  bool shard_on_device = false;
  std::uint64_t bucket_bytes = 25ULL << 20;  ///< comm.bucket_mb: a gradient bucket
  std::int64_t checkpointed_blocks = 0;    ///< student blocks recomputed in the backward
  std::int64_t student_extra_params = 0;   ///< channel projections and feature heads (fp32)
  /// student.lora_rank: the student is adapters over the teacher's frozen base; `student` keeps the
  /// teacher's shape (for activations) and its parameters are not trained.
  bool student_lora = false;
  std::int64_t lora_params = 0;            ///< trained adapters: the student's and a LoRA critic's (fp32)
  std::uint64_t lora_base_bytes = 0;       ///< the frozen base those adapters sit on (held once a rank)
  /// The base is in the teacher's weight dtype: a colocated teacher on the student's GPU lends
  /// the student its own tensors (one copy for both; job/student_rank.cpp share_with_teacher).
  bool lora_base_shareable = false;
  /// A LoRA pair (a two-expert teacher without student.expert): lora_base_bytes and lora_params
  /// count both experts'; one job per expert (student.expert) would hold half.
  bool lora_pair = false;
  std::int64_t batch = 1;                  ///< samples per student micro-batch (train.batch_size)
  std::int64_t tokens = 0;                 ///< tokens per sample: F/pt * H/ph * W/pw
  std::int64_t context_len = 0;            ///< text rows after padding (the teacher's text_len)
  std::int64_t feature_blocks = 0;         ///< teacher blocks whose hidden states are sent
  /// Samples a teacher forward carries per trained sample: 2 for a guided teacher (the
  /// conditional and the negative half of one batch), else 1.
  std::int64_t teacher_forwards = 1;
  /// The job needs the whole teacher on one rank (guided, trajectory): shard does not fit.
  bool whole_teacher = false;
  std::int64_t message_bytes = 0;          ///< one student message on the wire (MessageSpec + header)
  std::int64_t prefetch_depth = 2;         ///< comm.prefetch_depth
  std::int64_t eval_messages = 0;          ///< held-out messages each student keeps a copy of
  int teacher_ranks = 1;                   ///< teacher.ranks
  int student_ranks = 2;
  bool broadcast = false;                  ///< comm.mode = broadcast
  /// Fused scaled-dot-product attention (LibTorch 2.x, every CUDA build we target): no
  /// [B,heads,S,S] scores in memory. Off: the reference attention of LibTorch 1.13.
  bool fused_attention = true;
  /// The timestep is per token (TI2V): the time embedding and e0 have a row per token, not per
  /// sample (wan_dit.cpp runs the time MLP once per sample otherwise).
  bool per_token_time = false;
  bool cpu_job = false;                    ///< every rank on the host (the CPU build): only cpu applies
  /// stream: bytes the node's pinned arena may take (teacher.arena_limit; unset: the share
  /// kArenaShareOfAvailable of the host budget); 0: no arena, the copy threads stage each block.
  std::optional<std::uint64_t> arena_limit;
  int copy_threads = 4;                    ///< teacher.copy_threads: stream without the arena
  /// Framework overhead of one host-only process of the LibTorch it runs with (kHostProcessBytes
  /// for Debian's CPU build, kHostProcessBytesCudaLibTorch for a CUDA LibTorch on the host).
  std::uint64_t host_process_bytes = 192ull << 20;
  std::uint64_t device_budget = 0;         ///< bytes of one GPU
  std::uint64_t host_budget = 0;           ///< bytes of host memory of one node
  int gpus_per_node = 8;                   ///< ranks per node (one GPU each)
  /// student.sequence_parallel: groups of this many student ranks share each sample, each rank
  /// holding ceil(tokens/N) of its tokens through every block (the student's and the critic's
  /// activations), the heads split N ways in self-attention; a replica's teacher computes
  /// batch × (its students / N) samples.
  std::int64_t sequence_parallel = 1;
};

/// Host-to-device GB/s (1e9 bytes/s) from pinned memory that `plan` and teacher.layout auto
/// assume where none is measured or given (teacher.pcie_gbps): PCIe 5 x16 carries 63 GB/s a
/// direction in theory; H100/H200 hosts measure about 50-55 GB/s pinned (gpu-speed notes, §1.3).
inline constexpr double kPcieGbps = 50;
/// GB/s of one thread staging a block from the mapped checkpoint (page cache) into pinned
/// memory: 8 blocks of 33.6 MB in 44.7-53.5 ms on an H200 host (bench/results/gpu-h200.md).
inline constexpr double kStagingGbpsPerThread = 5.5;
/// The share of the node's available memory (MemAvailable at load, the host budget in `plan`)
/// the pinned arena may take when teacher.arena_limit is not set: pinned pages cannot be
/// reclaimed, so the rest stays for the other ranks and the page cache.
inline constexpr double kArenaShareOfAvailable = 0.8;

/// Bytes of the node's arena: every block of every expert in the teacher's dtype.
std::uint64_t arena_bytes(const PlanInput& in);
/// The limit the arena is held to (arena_limit, or the share of the host budget).
std::uint64_t arena_limit_of(const PlanInput& in);
/// stream: the blocks go to a pinned arena (its bytes within the limit), else the copy threads
/// stage them from the mapped checkpoint.
bool arena_fits(const PlanInput& in);
/// Where a streamed teacher's blocks come from, in words (the plan's note and the log's).
std::string stream_source(const PlanInput& in);

/// One category of one rank: bytes on its device and on the host.
struct PlanItem {
  std::string name;
  std::uint64_t device = 0;
  std::uint64_t host = 0;
  std::string note;
};

/// One rank's predicted memory, category by category.
struct RankPlan {
  std::vector<PlanItem> items;
  std::uint64_t device_total() const;
  std::uint64_t host_total() const;
  /// The item named `name` (throws wd::Error when absent).
  const PlanItem& at(const std::string& name) const;
};

/// The prediction for one placement, and whether it fits the budgets.
struct PlacementPlan {
  Placement placement = Placement::kCpu;
  bool applicable = true;
  std::string why_not;   ///< when not applicable, or what does not fit
  RankPlan teacher;      ///< the most loaded teacher rank
  RankPlan student;      ///< one student rank
  /// Student activations with every block checkpointed and with none (for the table).
  std::uint64_t student_activations_all = 0;
  std::uint64_t student_activations_off = 0;
  std::uint64_t host_per_node = 0;  ///< the fullest node: its ranks plus shared page cache
  bool fits = false;
};

struct Plan {
  std::vector<PlacementPlan> placements;  ///< in all_placements() order
  std::optional<Placement> recommended;
  std::string reason;
  /// When nothing fits at the input's student.sequence_parallel: the smallest larger size that
  /// divides the student's heads with which a placement fits, the teacher.ranks that lets its
  /// groups divide each replica's students (the input's where it can, the world kept), and that
  /// placement (0 and nullopt: none does).
  std::int64_t sequence_parallel_fits = 0;
  std::optional<Placement> sequence_parallel_placement;
  int sequence_parallel_teacher_ranks = 0;  ///< the teacher.ranks of that layout (the world kept)
};

/// Category names, in table order.
inline constexpr const char* kTeacherWeights = "teacher weights";
inline constexpr const char* kStreamingBuffers = "streaming buffers";
inline constexpr const char* kTeacherActivations = "teacher activations";
inline constexpr const char* kTransportBuffers = "transport buffers";
inline constexpr const char* kStudentWeights = "student weights";
inline constexpr const char* kGradients = "gradients";
inline constexpr const char* kOptimizerState = "optimizer state";
inline constexpr const char* kStudentActivations = "student activations";
inline constexpr const char* kFrameworkOverhead = "framework overhead";

/// Framework overhead of one process of this build on the host (LibTorch, Open MPI, HDF5 and
/// the runtime's own buffers): 167 MiB measured at start-up + 25 MiB once running (docs/placement.md).
inline constexpr std::uint64_t kHostProcessBytes = 192ull << 20;
/// The same with the pip CUDA LibTorch 2.11 on the host, no GPU touched: its CUDA libraries
/// add ~200 MiB of resident pages (test_plan_accuracy in the CUDA build: +190..217 MiB over
/// kHostProcessBytes on every rank, tiny and d256 jobs).
inline constexpr std::uint64_t kHostProcessBytesCudaLibTorch = 392ull << 20;
/// Host side of a CUDA process (CUDA LibTorch, driver, NCCL): an estimate, not yet measured.
inline constexpr std::uint64_t kHostCudaProcessBytes = 2ull << 30;
/// Device side of a CUDA process (context, cuBLAS workspaces, NCCL buffers): an estimate.
inline constexpr std::uint64_t kDeviceContextBytes = 1ull << 30;

/// Bytes one student block saves for its backward (its activations, autograd on).
std::uint64_t student_block_activation_bytes(const PlanInput& in);
/// Peak student activation bytes with `checkpointed` of its blocks recomputed in the backward.
std::uint64_t student_activation_bytes(const PlanInput& in, std::int64_t checkpointed);
/// Peak bytes of one no-grad teacher forward of `samples` samples (state + one block's transients).
std::uint64_t teacher_activation_bytes(const PlanInput& in, std::int64_t samples);

/// The prediction for every placement and the recommended one.
Plan make_plan(const PlanInput& in);

/// `generate`'s ranks: in.teacher_ranks of them, each a whole teacher computing the batches of
/// one student stream at a time (in.batch samples, in.teacher_forwards forwards each) and
/// writing them to its shards, one message in hand; no student rank (in.student_ranks 0). Only
/// gpu and cpu apply (generate holds the whole teacher on every rank); recommended: gpu where it
/// fits, else cpu.
Plan make_generate_plan(const PlanInput& in);

/// "1.50 GiB"-style rendering of the plan as a table per placement, then the recommendation
/// (teacher columns only for a plan without students: make_generate_plan's).
std::string format_plan(const PlanInput& in, const Plan& plan);

}  // namespace wd::plan
