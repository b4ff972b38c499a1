// The pieces of a student rank that run_student_rank (student_rank.cpp) wires: its stream of
// batches (student_stream.cpp), the models it trains and their gradient reduction
// (student_models.cpp), dmd's critic and real score (student_critic.cpp), and the loop's
// checkpoint hooks (student_checkpoints.cpp). Internal to wd_job.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/gradient_reducer.hpp"
#include "core/token_head_exchange.hpp"
#include "comm/receiver.hpp"
#include "comm/score_channel.hpp"
#include "job/train_job.hpp"
#include "student/dmd.hpp"
#include "student/ema.hpp"
#include "student/optimizer_shard.hpp"
#include "student/student_loop.hpp"
#include "student/student_parts.hpp"

namespace wd::job {

/// The seed a model's trainable tensors draw from: train.seed for the student (a pair's high
/// expert draws as a single student does), salted for a critic and for a pair's low expert, so
/// no two of them start alike.
std::uint64_t init_seed(const RunConfig& cfg, bool critic, std::optional<std::size_t> expert = std::nullopt);

struct OwnStream;

/// Where a student's batches come from: its teacher rank's link, the batches it makes itself
/// (its own teacher, colocated; or the data alone, flow), or its stream of a teacher cache.
struct StudentStream {
  std::unique_ptr<OwnStream> own;
  std::unique_ptr<comm::Receiver> link;
  comm::Receiver* transport = nullptr;

  StudentStream();
  StudentStream(StudentStream&&) noexcept;
  ~StudentStream();
  /// The colocated teacher's stage, or null.
  teacher::TeacherStage* own_stage() const;
};

StudentStream open_stream(const TrainJob& job, const c10::Device& device, RoleServices& services);

/// teacher.placement colocated, dmd: `stage`, this rank's own teacher, answers its requests on the spot.
std::unique_ptr<student::RealScore> local_score(teacher::TeacherStage& stage);

/// student.sequence_parallel's group of this student rank: its communicator and all-to-all.
struct SequenceGroup {
  MPI_Comm comm = MPI_COMM_NULL;
  std::unique_ptr<TokenHeadExchange> exchange;  ///< MPI or NCCL (comm.backend, as the gradient all-reduce)
  SequenceGroup() = default;
  SequenceGroup(const SequenceGroup&) = delete;
  SequenceGroup& operator=(const SequenceGroup&) = delete;
  ~SequenceGroup();
};

/// Splits the students into consecutive groups of student.sequence_parallel ranks (collective
/// over the students); null when it is 1. Its all-to-all carries tensors on `device`.
std::unique_ptr<SequenceGroup> open_sequence_group(const TrainJob& job, const c10::Device& device,
                                                   RoleServices& services);

/// The parts' set-up of the student (and, without feature pairs, of the dmd critic).
student::PartsSetup parts_setup(const TrainJob& job, const c10::Device& device);

/// A teacher checkpoint's tensors as a frozen LoRA base (zero-copy views of the mapping where the
/// dtype is kept: the ranks of a node share its pages; bf16-mixed asks bf16): `expert` of a
/// two-expert teacher (a LoRA pair's), else student_base(). `key` names the setting that asked
/// for it in the error for a job without a teacher.
WanDiT load_frozen_base(const TrainJob& job, const char* key, std::optional<std::size_t> expert = std::nullopt);

/// Everything the student trains, created once on its device (over `own`, a colocated teacher's
/// stage, where a LoRA base can share its tensors); the loop creates nothing.
student::StudentParts make_student_parts(const TrainJob& job, const c10::Device& device,
                                        const teacher::TeacherStage* own, TokenHeadExchange* sequence_parallel = nullptr);

/// How a trainable model trains on this rank, made by one factory for the student and dmd's
/// critic alike: its gradient reduction over the student group, under student.shard this rank's
/// slice (optimizer: over the reducer's bound buckets; gradients: the shard owns the gradient
/// slice and the reducer is its reduce-scatter), and its optimizer over the whole or the slice.
struct Training {
  std::unique_ptr<student::OptimizerShard> shard;  ///< null: whole (no sharding, or one student)
  std::unique_ptr<comm::GradientReducer> reducer;
  std::unique_ptr<student::TrainOptimizer> optimizer;  ///< AdamW at the factory's lr, [train]'s betas and decay
};

/// `parts`' Training at learning rate `lr` (`what` names the model in the log). Collective over
/// the students.
Training make_training(const TrainJob& job, student::StudentParts& parts, const c10::Device& device,
                       RoleServices& services, double lr, const char* what = "the student");

/// train.objective dmd on a student rank: the critic (its parts, AdamW, gradient reducer), the
/// real score (the channel to the replica's teacher, or the colocated teacher) and the trainer.
struct DmdSide {
  student::TrainConfig train;  ///< the loop's [train] (RunConfig::student_train)
  std::optional<comm::StudentService> service;
  std::unique_ptr<student::RealScore> score;
  std::unique_ptr<student::StudentParts> critic;
  Training training;  ///< the critic's reducer, (student.shard) slice and optimizer
  std::unique_ptr<student::DmdTrainer> trainer;
  std::unique_ptr<student::DmdMethod> method;  ///< the loop's method (StudentJob::method)
};

/// The channel to the teacher (dedicated layouts; right after the link, as the teacher makes it).
void open_service(DmdSide& side, const TrainJob& job, const c10::Device& device, RoleServices& services);

/// The critic and the trainer, after the generator's reducer (every student makes its reducers in
/// one order).
void make_dmd_trainer(DmdSide& side, const TrainJob& job, student::StudentParts& generator, const c10::Device& device,
                      int group_rank, const std::vector<int>& peers, RoleServices& services);

/// The loop's checkpoint hooks: restore from job.resume_path, and save (the first student writes
/// through the store; every replica holds the same state, except that with student.shard each
/// student writes its own slices of the AdamW moments into the same checkpoint).
void attach_checkpoints(student::StudentJob& loop, TrainJob& job, student::StudentParts& parts,
                        RoleServices& services, const c10::Device& device);

/// What the loop reports; the students' first rank saves the student unless stopped for a requeue.
RoleResult finish_student(const TrainJob& job, const student::StudentStats& stats, student::StudentParts& parts,
                          const student::EmaWeights* ema, bool first);

}  // namespace wd::job
