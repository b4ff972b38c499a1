// Speed model: predicted samples/s and student wait of every layout a job's ranks can take
// (colocated, or T teacher ranks in replicas x stages feeding S students), from matmul FLOP
// counts and the rates the ranks sustain. `plan` prints it; docs/placement.md says how it was
// checked (bench/results/throughput.md).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "plan/planner.hpp"

namespace wd::plan {

/// Share of the one-thread matmul micro-benchmark's rate (teacher::matmul_gflops, 256x512x512)
/// that a whole teacher forward / student training step sustains on the host, fitted on the
/// `small` job (bench/results/throughput.md): attention's softmax, norms, RoPE, GELU, the
/// optimizer and the loss run at memory speed, not at matmul speed.
inline constexpr double kForwardEfficiency = 0.55;
inline constexpr double kTrainEfficiency = 0.45;

/// Seconds a teacher or student rank spends per job step besides the models: reading and
/// noising the batch, the messages, the gradient and loss all-reduces, bookkeeping (a colocated
/// rank, both roles, counts it twice). Fitted on the tiny-64 job's rows of LibTorch 1.13
/// (bench/results/throughput.md), where a step is 10-20 ms of compute; it is about 1% of a
/// `small` step.
inline constexpr double kStepOverheadSeconds = 0.0025;

/// Matmul FLOPs of one forward of one sample of `d` (2 per multiply-add): per block the q, k, v,
/// o and cross-attention projections, both attentions' QK^T and PV, and the FFN; the per-token
/// time projection. Embeddings and head are left out (under 2% for every preset).
double dit_forward_flops(const DitShape& d, std::int64_t tokens, std::int64_t context_len);

/// teacher.placement stream: what its forward copies, and how fast.
struct StreamCost {
  bool on = false;               ///< the teacher streams its blocks
  double block_bytes = 0;        ///< one block in the teacher's dtype
  std::int64_t blocks = 0;       ///< blocks a forward copies (one expert's)
  double gbps = kPcieGbps;       ///< the copies' rate (stream_gbps)
  double pcie_gbps = kPcieGbps;  ///< the host-to-device rate it was derived from
  std::string source;            ///< where the blocks come from (stream_source)
};

/// The copies' rate: PCIe from a pinned arena; without one, the copy threads' staging
/// (kStagingGbpsPerThread each), never above PCIe.
double stream_gbps(double pcie_gbps, bool arena, int copy_threads);
/// The stream of `in`'s teacher over a host-to-device link of `pcie_gbps`.
StreamCost stream_cost(const PlanInput& in, double pcie_gbps);
/// Seconds one forward's copies take (each block once).
double stream_copy_seconds(const StreamCost& s);
/// Seconds of a streamed forward whose blocks compute in `compute_s` resident: block i+1's copy
/// overlaps block i's compute (and block 0's the previous forward's last block), so with
/// blocks of one size the forward takes the longer of its compute and its copies.
double streamed_forward_seconds(double compute_s, const StreamCost& s);

/// What the prediction needs besides the shapes.
struct SpeedInput {
  DitShape teacher;
  DitShape student;
  std::int64_t tokens = 0;       ///< per sample
  std::int64_t context_len = 0;  ///< text rows
  std::int64_t batch = 1;        ///< samples per student step (train.batch_size)
  std::int64_t recomputed_blocks = 0;  ///< student.checkpointing: blocks run twice in a step
  int ranks = 3;                 ///< world ranks
  /// Cores the ranks share (a CPU job on one host); 0 = each rank has its own device (GPUs).
  int cores = 0;
  /// Sustained GFLOP/s of one rank: the teacher's forward (in its compute dtype) and the
  /// student's training step (forward + backward, fp32 or bf16-mixed).
  double teacher_gflops = 0;
  double student_gflops = 0;
  /// Measured seconds per sample (plan's calibration: the job's models run on this host); when
  /// set they replace FLOPs / rate.
  double teacher_measured_s = 0;
  double student_measured_s = 0;
  /// The teacher forward measured at several sizes: (samples a forward, seconds per sample).
  /// When set, each layout's teacher computes in the size that is fastest per sample among those
  /// up to its replica's batch (teacher.micro_batch), instead of teacher_measured_s.
  std::vector<std::pair<std::int64_t, double>> teacher_measured_by_size;
  /// Teacher forwards per trained sample (train.objective: velocity 1, guided 2: the
  /// conditional and the negative; trajectory (2 when guided)·teacher.steps/student.steps); the
  /// teacher's seconds per sample scale with it.
  double teacher_forwards = 1;
  /// Student forwards without a backward per trained sample on top of the step
  /// (train.trajectory_rollout p: p·(k − 1)/2 on average, the jumps of a roll-out).
  double student_extra_forwards = 0;
  /// The job needs the whole teacher on one rank (guided, trajectory, an i2v teacher): no shard stages.
  bool whole_teacher = false;
  /// Steps a teacher may run ahead of its consumers (comm.prefetch_depth ring slots).
  std::int64_t prefetch_depth = 2;
  /// Fixed seconds per rank and job step (kStepOverheadSeconds).
  double step_overhead_s = kStepOverheadSeconds;
  /// teacher.placement stream: every teacher forward also copies its blocks (the colocated
  /// layouts' teachers are on the student's GPU, resident: not streamed).
  StreamCost stream;
};

/// One candidate layout and its predicted speed.
struct LayoutSpeed {
  std::string name;          ///< "colocated x3", "1 teacher + 2 students", "shard 2 stages + 1 student"
  bool colocated = false;
  int teacher_ranks = 0;
  int stages = 1;
  int students = 0;
  std::int64_t replica_batch = 0;  ///< samples a teacher replica computes per step
  std::int64_t micro_batch = 0;    ///< samples a teacher forward (teacher.micro_batch); 0 = the whole batch
  double samples_per_s = 0;
  double student_wait = 0;   ///< fraction of a student's time spent waiting for batches
  std::string bound;         ///< what limits it: "teacher", "students" or "cores"
  double stream_overhead = 1;  ///< the teacher's streamed forward over its resident one
};

/// Seconds one rank needs per sample: the teacher's forward, the student's training step (the
/// measured ones when given, else FLOPs over the rate).
double teacher_seconds_per_sample(const SpeedInput& in);
double student_seconds_per_sample(const SpeedInput& in);

/// How much faster per sample a smaller forward size must be to be chosen over a larger one:
/// timing noise does not reach it, and the whole batch is the simpler schedule and the bit-exact
/// one.
inline constexpr double kMicroBatchMargin = 0.05;

/// The teacher's forward for a replica computing `replica_batch` samples a step.
struct TeacherForward {
  std::int64_t micro_batch = 0;   ///< samples a forward; 0 = the whole batch
  double seconds_per_sample = 0;
};

/// The size to compute in, from forwards timed at several sizes (samples a forward, seconds per
/// sample): the largest size up to `replica_batch`, unless a smaller one is faster per sample
/// than the best larger one by kMicroBatchMargin. A replica batch below every measured size
/// takes the smallest. The one rule of `plan`, `teacher.layout auto` and `teacher.micro_batch
/// auto`.
TeacherForward fastest_forward(std::vector<std::pair<std::int64_t, double>> by_size, std::int64_t replica_batch);

/// fastest_forward over in.teacher_measured_by_size; without measurements by size, the whole
/// batch at teacher_seconds_per_sample. A streamed teacher's forward of n samples takes at
/// least its copies (streamed_forward_seconds), so small forwards cost it more per sample.
TeacherForward teacher_forward(const SpeedInput& in, std::int64_t replica_batch);

/// The forward sizes `plan` and `train --teacher.layout auto` time the teacher at for a job of
/// `batch` samples per student on `ranks` ranks: the largest replica batch of its layouts (one
/// teacher rank feeding all the others' students, at most 4 students' worth) and its halvings
/// (ceil) down to 1; micro_batch auto times the same series for the batch it runs.
std::vector<std::int64_t> teacher_forward_sizes(std::int64_t largest);

/// Every layout of in.ranks ranks that the process layout allows (students divisible by the
/// replicas), colocated first, each with its prediction; fastest first.
std::vector<LayoutSpeed> predict_layouts(const SpeedInput& in);

/// Seconds `generate` takes on in.ranks ranks, each a whole resident teacher, when its busiest
/// rank writes `messages` messages: each one in.batch samples at the teacher's seconds per
/// sample (teacher_forward for a batch of in.batch, in.teacher_forwards included) plus
/// in.step_overhead_s, the ranks sharing in.cores (0: a device each).
double generate_seconds(const SpeedInput& in, std::int64_t messages);

/// The flags that select `l`: placement, teacher ranks, stages and micro-batch.
std::string layout_flags(const LayoutSpeed& l);

/// The table `plan` prints: one row per layout, the recommendation, and the rates used.
std::string format_speeds(const SpeedInput& in, const std::vector<LayoutSpeed>& layouts);

}  // namespace wd::plan
