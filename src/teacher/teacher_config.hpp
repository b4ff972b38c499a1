// TeacherConfig: the `[teacher]` section.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "core/choices.hpp"
#include "core/errors.hpp"
#include "core/config.hpp"
#include "core/guidance_scale.hpp"

namespace wd::teacher {

struct TeacherConfig {
  /// Checkpoint directory / .safetensors file, or `builtin:tiny` (generated into the run's cache).
  std::string checkpoint = "builtin:tiny";
  std::string model_config;     ///< config.json override (default: beside the checkpoint)
  DtypeChoice dtype = DtypeChoice::kBf16;  ///< compute / weight dtype (auto: each tensor as stored)
  /// Dtype of the matmuls: auto (fp32 where the weights' dtype multiplies slowly, measured at
  /// start: a CPU without bf16 instructions) | weights | fp32. The weights keep teacher.dtype.
  TeacherCompute compute = TeacherCompute::kAuto;
  /// Samples per teacher forward: a step's batch is computed in slices of this size (0 = all at
  /// once; auto = the fastest of the batch and its halvings, timed at start-up). Outputs equal
  /// the unsplit batch's up to the BLAS's rounding; smaller slices can be faster on a CPU.
  std::string micro_batch = "0";
  int ranks = 1;                ///< teacher ranks; the other ranks are students
  /// given: teacher.ranks / placement / stages as set; auto: world rank 0 times the job's
  /// models at start-up and picks the fastest layout of the world's ranks (docs/placement.md).
  TeacherLayout layout = TeacherLayout::kGiven;
  /// Where the weights live and compute runs: gpu | cpu | stream | shard | auto (docs/placement.md).
  TeacherPlacement placement = TeacherPlacement::kAuto;
  /// Pipeline stages per teacher replica for `shard`; 0 = the number of ranges in shard_map, or
  /// teacher.ranks (one replica) without one.
  int stages = 0;
  /// Blocks of each stage, e.g. `0-13,14-27,28-39`; empty = balanced by parameter bytes.
  std::string shard_map;
  /// `stream`: blocks copied to the device ahead of the one computing (device buffers = ahead + 1).
  int stream_ahead = 2;
  /// `stream`: host bytes the node's pinned arena (one copy of the streamed blocks in
  /// teacher.dtype, shared by the node's teacher ranks) may take; empty = kArenaShareOfAvailable
  /// of MemAvailable at load; 0 = no arena. Past it, copy_threads copy from the mapped checkpoint.
  std::string arena_limit;
  /// `stream` without the arena: threads staging each block from the mapped checkpoint.
  int copy_threads = 4;
  /// Host-to-device GB/s for the stream's copy time (plan, teacher.layout auto); 0 = measured
  /// on the GPU at start-up, else plan::kPcieGbps.
  double pcie_gbps = 0;
  /// `gpu` / `stream` / `shard` in a CUDA build: the device; empty = cuda:<local rank mod GPUs>.
  std::string device;
  /// `auto`: memory to plan with; empty = detected (cudaMemGetInfo, /proc/meminfo).
  std::string gpu_memory;
  std::string host_memory;
  /// A14B two-expert teacher: the high-noise expert serves t >= boundary·1000; 0 = the
  /// model_type's default (t2v 0.875, i2v 0.9).
  double boundary = 0;
  /// train.objective guided: the classifier-free guidance scale g of the teacher's target
  /// v_neg + g·(v_cond − v_neg) (docs/objectives.md), and the negative context's file (empty: zeros).
  GuidanceScale guidance = 5.0;
  std::string negative;
  /// train.objective trajectory: the teacher's sampler (steps, σ shift, solver) along whose
  /// schedule the trajectories run (docs/objectives.md#trajectory).
  std::int64_t steps = 40;
  double shift = 5.0;
  Solver solver = Solver::kUnipc;

  /// teacher.micro_batch as a number of samples; nullopt for auto or a value that is not one.
  std::optional<std::int64_t> micro_batch_samples() const {
    if (micro_batch.empty() || micro_batch.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    try {
      return std::stoll(micro_batch);
    } catch (const std::out_of_range&) {
      return std::nullopt;
    }
  }

  /// teacher.arena_limit in bytes: 0 for "0" (no arena), nullopt when empty (measured at load).
  std::optional<std::uint64_t> arena_limit_bytes() const {
    if (arena_limit.empty()) return std::nullopt;
    if (arena_limit == "0") return 0;
    return parse_size(arena_limit, "teacher.arena_limit");
  }

  void bind(OptionTable& t) {
    t.bind("teacher.checkpoint", checkpoint,
           "teacher checkpoint (directory or .safetensors), or builtin:tiny")
        .bind("teacher.model_config", model_config, "config.json override for the checkpoint")
        .bind("teacher.dtype", dtype,
              "teacher weight and compute dtype (auto: each tensor as stored, so a `convert`ed file keeps "
              "its fp32 islands)")
        .bind("teacher.compute", compute,
              "matmul dtype: auto (fp32 where the weight dtype's matmul is slow: measured at start, "
              "e.g. bf16 on a CPU without bf16 instructions), weights (teacher.dtype) or fp32; the weights "
              "keep teacher.dtype")
        .bind("teacher.micro_batch", micro_batch,
              "samples per teacher forward (a step's batch in slices): N, 0 (the whole batch at once) "
              "or auto (world rank 0 times the job's teacher on the batch and its halvings at start-up "
              "and takes the fastest per sample); with teacher.layout auto, 0 and auto take the chosen "
              "layout's micro-batch")
        .bind("teacher.ranks", ranks, "number of teacher ranks (world ranks 0..ranks-1); 0 with train.objective flow (no teacher)")
        .bind("teacher.layout", layout,
              "given (teacher.ranks, placement and stages as set) | auto (at start-up the job's teacher "
              "forward and student step are timed and the fastest layout of the world's ranks is used: "
              "colocated, or teacher ranks as replicas x stages, with its teacher micro-batch; what `plan` "
              "recommends)")
        .bind("teacher.placement", placement,
              "gpu: weights on the rank's GPU; cpu: host; stream: host-resident, blocks copied to "
              "the device ahead of use; shard: blocks split over teacher.stages ranks; colocated: "
              "no teacher ranks, every student rank maps the teacher and computes its own targets; "
              "auto: the planner picks the fastest that fits")
        .bind("teacher.stages", stages,
              "shard: pipeline stages per replica; 0 = ranges in shard_map, else teacher.ranks")
        .bind("teacher.shard_map", shard_map,
              "shard: blocks per stage, e.g. 0-13,14-27,28-39; empty = balanced by parameter bytes")
        .bind("teacher.stream_ahead", stream_ahead, "stream: blocks copied ahead of the computing one")
        .bind("teacher.arena_limit", arena_limit,
              "stream: host memory the node's pinned arena may take (one copy of the blocks in teacher.dtype, "
              "shared by the node's teacher ranks, each block one DMA); empty = 80% of MemAvailable at load, "
              "0 = no arena; past it teacher.copy_threads copy each block from the mapped checkpoint")
        .bind("teacher.copy_threads", copy_threads,
              "stream without the arena: threads that stage each block from the mapped checkpoint")
        .bind("teacher.pcie_gbps", pcie_gbps,
              "host-to-device GB/s the stream's copy time is planned with (plan, teacher.layout auto); 0 = "
              "measured on the GPU at start-up, 50 (PCIe 5 x16, pinned) where none is measured")
        .bind("teacher.device", device, "device of gpu/stream/shard; empty = cuda:<local rank mod GPUs>")
        .bind("teacher.gpu_memory", gpu_memory, "auto: GPU memory to plan with (e.g. 80GiB); empty = detect")
        .bind("teacher.host_memory", host_memory, "auto: host memory per node (e.g. 1TiB); empty = detect")
        .bind("teacher.boundary", boundary,
              "two-expert (A14B) teacher: high-noise expert for t >= boundary*1000; 0 = the model's "
              "default (t2v 0.875, i2v 0.9)");
    bind_guidance(t, "teacher.guidance", guidance,
                  "train.objective guided, trajectory and dmd: guidance scale g, target v_neg + g*(v_cond - v_neg) "
                  "(1 = no guidance; Wan 2.2 samples with 3-5); LOW,HIGH: each expert of a two-expert teacher its "
                  "own (the official T2V-A14B: 3,4; I2V-A14B: 3.5)")
        .bind("teacher.negative", negative,
              "train.objective guided and trajectory: safetensors with `context` [L,text_dim] or [1,L,text_dim], the negative "
              "prompt's encoding; empty = zeros (what train.cond_dropout trains a flow model to answer)")
        .bind("teacher.steps", steps,
              "train.objective trajectory: the teacher's sampling steps per trajectory (a multiple of student.steps)")
        .bind("teacher.shift", shift,
              "train.objective trajectory: σ shift of the teacher's and the student's schedules "
              "(Wan 2.2 samples with 5; 12 for t2v-A14B)")
        .bind("teacher.solver", solver, "train.objective trajectory: the teacher's sampler");
  }
  void validate(ConfigProblems& p) const {
    p.check(micro_batch == "auto" || micro_batch_samples().has_value(),
            "teacher.micro_batch(" + micro_batch + ") must be auto or a number of samples >= 0");
    p.check(ranks >= 0, "teacher.ranks(" + std::to_string(ranks) + ") must be >= 0 (0: no teacher, train.objective flow)");
    p.check(layout != TeacherLayout::kAuto || (shard_map.empty() && stages == 0),
            "teacher.layout auto chooses the stages: leave teacher.stages(" + std::to_string(stages) +
                ") at 0 and teacher.shard_map(" + shard_map + ") empty");
    p.check(!checkpoint.empty(), "teacher.checkpoint must not be empty");
    p.check(placement != TeacherPlacement::kColocated || ranks == 1,
            "teacher.placement colocated puts the teacher on every rank, which are all students: "
            "teacher.ranks(" + std::to_string(ranks) + ") is not used there; leave it at 1");
    p.check(stages >= 0, "teacher.stages(" + std::to_string(stages) + ") must be >= 0");
    p.check(stages <= 1 || placement == TeacherPlacement::kShard || placement == TeacherPlacement::kAuto,
            "teacher.stages(" + std::to_string(stages) + ") > 1 needs teacher.placement = shard, not " +
                name_of(placement));
    p.check(shard_map.empty() || placement == TeacherPlacement::kShard,
            "teacher.shard_map(" + shard_map + ") needs teacher.placement = shard, not " + name_of(placement));
    p.check(boundary == 0 || (boundary > 0 && boundary < 1),
            "teacher.boundary(" + std::to_string(boundary) + ") must be 0 (the default) or in (0, 1)");
    p.check(stream_ahead >= 1 && stream_ahead <= 8,
            "teacher.stream_ahead(" + std::to_string(stream_ahead) + ") must be in 1..8");
    try {
      static_cast<void>(arena_limit_bytes());
    } catch (const ConfigError& e) {
      p.check(false, std::string(e.what()) + " (or 0: no arena)");
    }
    p.check(copy_threads >= 1 && copy_threads <= 64,
            "teacher.copy_threads(" + std::to_string(copy_threads) + ") must be in 1..64");
    p.check(pcie_gbps >= 0, "teacher.pcie_gbps(" + std::to_string(pcie_gbps) + ") must be >= 0 (0: measured)");
  }
};

}  // namespace wd::teacher
