// The start-up stages of `train`, each a named function that returns what it decided. Those
// that look at files or time models run on the one rank that decides (no MPI inside, so a test
// calls them in one process and `layout` calls them without MPI); start_train runs them in
// order, every rank agreeing on each outcome (all go on, or all stop with one error).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/mpi_runtime.hpp"
#include "comm/process_groups.hpp"
#include "core/checkpoint_store.hpp"
#include "core/topology.hpp"
#include "data/dataset_info.hpp"
#include "job/run_config.hpp"
#include "job/train_job.hpp"
#include "model/wan_config.hpp"
#include "plan/planner.hpp"

namespace wd::job {

/// teacher.layout auto's answer: the fastest layout of the world's ranks for this job.
struct LayoutChoice {
  bool colocated = false;
  int teacher_ranks = 1;
  int stages = 1;                ///< pipeline stages per replica (1: whole teachers)
  std::int64_t micro_batch = 0;  ///< samples a teacher forward; 0: the whole batch
};

/// Where the teacher lives and the dtype its matmuls run in.
struct PlacementChoice {
  plan::Placement placement = plan::Placement::kCpu;
  std::optional<c10::ScalarType> compute;  ///< nullopt: each weight's stored dtype
};

/// The data set's shapes, as the ranks that read it found them.
struct DataShape {
  std::array<std::int64_t, 4> latent{};  ///< channels, frames, height, width
  std::int64_t context_len = 0;
  std::int64_t samples = 0;
};

/// Where training starts: step 0 (no path), or a checkpoint's step and folder.
struct ResumePoint {
  std::int64_t step = 0;
  std::string path;
};

/// The base config of a model trained on the data alone (train.objective flow), before the
/// student.* keys apply: the tiny preset's architecture with the data set's latent channels
/// (in and out), text width and length, of `model_type` (student.model_type; empty: t2v), an
/// i2v model's in_dim counting its y (2C + 4).
WanConfig model_for_data(const data::DatasetInfo& info, const std::string& model_type = "");

/// Creates the run directory and, where the config names them and they are missing, the
/// builtin tiny teacher and data set in its cache.
void prepare_run_dir(const RunConfig& cfg);

/// teacher.layout auto: times this job's teacher forward and student step on the student's
/// device and takes the fastest layout of `world` ranks whose global batch divides
/// train.eval_samples and, on a GPU, whose colocated teacher fits beside the student; logs
/// every layout ruled out and why, and keeps the answer in the run directory (layout.json),
/// which a resumed run reuses. ConfigError when no layout suits.
LayoutChoice choose_layout(const RunConfig& cfg, int world);

/// Writes a layout choice into the teacher keys, as if they had been given: colocated, or
/// teacher.ranks and (stages > 1) shard over teacher.stages; its micro-batch unless
/// teacher.micro_batch was given as a number of samples.
void apply_layout(const LayoutChoice& choice, teacher::TeacherConfig& teacher);

/// The teacher's placement (teacher.placement; auto: the planner's pick for this machine;
/// colocated: where the student computes) and compute dtype (teacher.compute). ConfigError for
/// a placement this build or machine cannot run (gpu without CUDA, a bad teacher.device).
PlacementChoice choose_placement(const RunConfig& cfg, int world);

/// Every rank's role with replicas of `stages` stages: every rank a student (teacher.placement
/// colocated, or no teacher), or teacher.ranks teachers, each replica on one node where
/// `node_of_rank` allows. ConfigError naming the counts that do not divide.
comm::Layout layout_with_stages(const RunConfig& cfg, int world, int stages, const std::vector<int>& node_of_rank);
/// Every rank's role for a decided placement: layout_with_stages with stages_for(placement).
comm::Layout make_layout(const RunConfig& cfg, plan::Placement placement, int world,
                         const std::vector<int>& node_of_rank);

/// The GPU a rank would compute on, on a node with `gpus` GPUs (-1: the host), by the rules of
/// rank_device (teacher_device, student_device) with a GPU assumed usable: what `layout` prints.
int planned_gpu(const RunConfig& cfg, plan::Placement placement, Role role, int local_rank, int gpus);

/// The device this rank computes on: a teacher's (teacher::teacher_device), or a student's
/// (student::student_device; a colocated student's teacher shares it). ConfigError where this
/// rank cannot use it.
c10::Device rank_device(const RunConfig& cfg, plan::Placement placement, Role role, int local_rank);

/// Samples a replica computes per transport step, and all replicas together (the global batch).
std::int64_t per_replica_batch(const RunConfig& cfg, const comm::Layout& layout);
std::int64_t global_batch(const RunConfig& cfg, const comm::Layout& layout);

/// The cross-section checks once the teacher and the layout are known, every problem named in
/// one ConfigError: student.features against both models' blocks, the stages against the
/// teacher's blocks, teacher.shard_map, checkpoint.every against train.steps, the held-out set
/// against the global batch, --inject-fault's rank and step, the resume path.
void check_job(const RunConfig& cfg, const WanConfig& teacher, const comm::Layout& layout);
/// student.expert against the teacher (`experts`: null without one): it needs a two-expert
/// teacher; what it cannot do (dmd, rollouts, sampling probes: they cross both experts) and ranges
/// the noise or the student's steps never reach are refused. Without it a LoRA student of a
/// two-expert teacher is a LoRA pair, refused with feature matching.
void check_student_expert(const RunConfig& cfg, const WanExperts* experts);
/// student.sequence_parallel against the layout and the models (`experts`: null without a
/// teacher): N must divide each replica's student ranks and the student's heads; what is not
/// built with it yet (colocated, dmd, broadcast, features, LoRA pairs, projections) is named.
void check_sequence_parallel(const RunConfig& cfg, const WanExperts* experts, const comm::Layout& layout);
/// student.sequence_parallel against the tokens of a sample of `latent` [C,F,H,W].
void check_sequence_tokens(const RunConfig& cfg, const WanConfig& model, const std::array<std::int64_t, 4>& latent);

/// The data set checked for `teacher` (readable HDF5, its shapes, more samples than the
/// held-out ones); DataError naming the file and the field otherwise.
data::DatasetInfo check_data(const RunConfig& cfg, const WanConfig& teacher);

/// teacher.micro_batch auto: times the teacher's forward over a replica's batch on `device`
/// and its halvings, and returns the fastest size per sample (0: whole); a resumed run reuses
/// the first start's answer (micro_batch.json in the run directory).
std::int64_t choose_teacher_micro_batch(const TrainJob& job, const c10::Device& device);

/// The checkpoint folder training resumes from at `step` (checkpoint.resume auto: the store's
/// folder of that step; else the folder given); "" at step 0.
std::string resume_path(const RunConfig& cfg, std::int64_t step);

/// The step to resume at: checkpoint.resume auto takes the store's latest good checkpoint, a
/// folder is verified. ConfigError when it leaves nothing to train.
ResumePoint find_resume_point(const RunConfig& cfg, CheckpointStore& store);

/// Every start-up stage of `train` for `job` (cfg, args and config_ini set), in order, each
/// agreed by all ranks: validation, roles, logging and threads, the run directory, the layout
/// (teacher.layout auto), the placement, the rank layout log, the teacher, data and
/// cross-section checks, the data shapes, the teacher micro-batch and the resume point.
void start_train(TrainJob& job, comm::MpiRuntime& mpi);

}  // namespace wd::job
