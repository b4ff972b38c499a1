// train.objective dmd: distribution matching distillation (DMD2, Yin et al. 2024) with the
// teacher as the real-score service. The student (the generator) samples in student.steps; a
// critic (a second DiT on the student ranks) learns the flow of the generator's samples; the
// generator moves its samples along the difference of the critic's and the teacher's guided x0
// predictions at re-noised samples (docs/objectives.md#dmd).
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/gradient_reducer.hpp"
#include "comm/health_channel.hpp"
#include "comm/message_spec.hpp"
#include "comm/receiver.hpp"
#include "comm/score_channel.hpp"
#include "comm/sender.hpp"
#include "memory/memory_report.hpp"
#include "model/safetensors.hpp"
#include "student/checkpointing.hpp"
#include "student/dmd_config.hpp"
#include "student/student_config.hpp"
#include "student/student_parts.hpp"
#include "student/optimizer_shard.hpp"
#include "student/train_optimizer.hpp"
#include "student/student_method.hpp"
#include "student/train_state.hpp"
#include "student/train_step.hpp"

namespace wd::student {

/// The fixed numbers of a dmd run.
struct DmdSpec {
  std::vector<double> sigmas;  ///< the generator's k + 1 σ (student.steps on teacher.shift's schedule)
  bool simulate = true;        ///< train.dmd_start simulate | data
  double t_min = 0.02, t_max = 0.98;  ///< u range of the re-noising σ = shift(u)
  double shift = 5.0;                 ///< teacher.shift
  std::uint64_t seed = 0;             ///< train.seed
  /// The student's rank in its group (under student.sequence_parallel its group's index: a
  /// group's ranks draw the same samples): its own noise.
  std::uint64_t student = 0;
  std::array<std::int64_t, 4> latent{};  ///< C, F, H, W

  /// From the loop's [train] (RunConfig::student_train(): sample_steps = student.steps,
  /// sample_shift = teacher.shift, the generator's schedule) and the dmd keys.
  static DmdSpec from(const TrainConfig& train, const DmdConfig& dmd, const std::array<std::int64_t, 4>& latent,
                      int student);
  /// The host generator of draw `key` under `salt`: seeded by (seed, salt, key, student), so each
  /// student draws its own and a resume draws the same.
  at::Generator generator(std::uint64_t salt, std::int64_t key) const;
};

/// What a batch's image condition fixes in the samples made for it (model/image_condition): with
/// per-token t (TI2V-5B's image mode), the frames its t holds at 0 are its x_t's clean image, in
/// every jump, re-noising and fake sample; nothing otherwise. (An i2v teacher's y rides in the
/// batch to every forward.)
class CleanFrames {
 public:
  CleanFrames() = default;
  /// From `batch`'s t and x_t (none when it lacks either or t is per sample).
  CleanFrames(const StudentParts& model, const comm::TensorDict& batch);
  /// `x` with the clean frames put back (keep_clean_frames).
  torch::Tensor keep(const torch::Tensor& x) const;
  /// Timesteps shaped as the batch's at each sample's `t` [B] (timesteps_like): `t` itself when
  /// the batch's t is per sample.
  torch::Tensor timesteps(const torch::Tensor& t) const;
  /// The model timesteps of `batch` samples at σ: fp32 1000·σ, [B] on `device` or per token as the
  /// batch's (its clean tokens at 0).
  torch::Tensor timesteps_at(double sigma, std::int64_t batch, const c10::Device& device) const;

 private:
  torch::Tensor clean_, like_, weights_;
};

/// The generator's sample x̂0 [B,C,F,H,W] in the teacher's latent space for the contexts of
/// `inputs` (context, context_lens; with dmd_start data also x_t and t): simulate runs the k Euler
/// jumps from noise seeded by (seed, `key`, student), data jumps once from x_t at σ = t / 1000.
/// With `grad` the last jump keeps its graph (backward simulation: only the last step learns).
/// The batch's image condition goes with every jump (CleanFrames, y).
torch::Tensor generate(StudentParts& generator, const comm::TensorDict& inputs, const DmdSpec& spec,
                       std::int64_t key, bool grad, const CheckpointPolicy& policy);

/// A sample re-noised: x = (1 − σ)·x0 + σ·noise with σ = shift(u), u uniform in [t_min, t_max],
/// one σ per sample; t = 1000·σ. Seeded by (seed, `salt`, `key`, student). `clean`'s frames stay
/// clean in x, and t is shaped as its batch's.
struct Renoised {
  torch::Tensor x, t, sigma, noise;  ///< sigma [B,1,1,1,1]; t [B] (or per token, as `clean`'s batch)
};
Renoised renoise(const torch::Tensor& x0, const DmdSpec& spec, std::int64_t key, std::uint64_t salt,
                 const CleanFrames& clean = {});

/// The DMD gradient of each sample: (fake_x0 − real_x0) / mean|x0 − real_x0| over the sample's
/// elements (DMD2's normaliser), NaN/Inf set to 0. All [B,C,F,H,W]. With frame `weights`
/// (frame_loss_weights, [B,1,F,1,1]) the frames of weight 0 get none and the mean is over the rest.
torch::Tensor dmd_gradient(const torch::Tensor& x0, const torch::Tensor& real_x0, const torch::Tensor& fake_x0,
                           const torch::Tensor& weights = {});
/// 0.5·mean((x0 − sg(x0 − grad))²): its gradient in x0 is grad / numel.
torch::Tensor dmd_loss(const torch::Tensor& x0, const torch::Tensor& grad);

/// DMD2's GAN term (critic.gan_weight, train.gan_weight). Noise of x0's shape seeded by (seed,
/// `salt`, `key`, student), on x0's device.
torch::Tensor seeded_noise(const torch::Tensor& x0, const DmdSpec& spec, std::int64_t key, std::uint64_t salt);
/// `x0` noised to the levels of `t` [B] (σ = t / 1000 per sample, the stream's real samples' own):
/// (1 − σ)·x0 + σ·noise, the fake sample the realism classifier sees beside a real one at that t.
torch::Tensor noised_to(const torch::Tensor& x0, const torch::Tensor& t, const torch::Tensor& noise);
/// The classifier's loss: mean(softplus(fake)) + mean(softplus(−real)) (real → +, fake → −).
torch::Tensor classifier_loss(const torch::Tensor& real_logits, const torch::Tensor& fake_logits);
/// The generator's GAN gradient in x0: ∂/∂x0 of mean(softplus(−D(noised_to(x0, t, noise)))), D
/// the critic's realism classifier (StudentParts::realism) with the contexts (and y) of `in`, the
/// noised sample's clean frames kept (`clean`). Only x0 is differentiated: the critic's parameters
/// get no gradient.
torch::Tensor gan_gradient(StudentParts& critic, const torch::Tensor& x0, const torch::Tensor& t,
                           const torch::Tensor& noise, const comm::TensorDict& in, const CheckpointPolicy& policy,
                           const CleanFrames& clean = {});

/// The teacher's guided velocity at a generator's re-noised samples: asked at a cycle's request
/// step, read at its generator update.
class RealScore {
 public:
  virtual ~RealScore() = default;
  /// Sends (or computes) cycle `cycle`'s request: x_t, t, context, context_lens.
  virtual void ask(std::int64_t cycle, const comm::TensorDict& request) = 0;
  /// The answer to cycle `cycle`'s request [b,C,F,H,W], valid until release(cycle).
  virtual const torch::Tensor& answer(std::int64_t cycle) = 0;
  virtual void release(std::int64_t cycle) = 0;
  /// Seconds blocked waiting for answers.
  virtual double wait_seconds() const = 0;
};

/// RealScore over the channel to the replica's teacher rank (comm::student_service).
class RemoteScore final : public RealScore {
 public:
  RemoteScore(comm::Sender& requests, comm::Receiver& answers) : requests_(requests), answers_(answers) {}
  void ask(std::int64_t cycle, const comm::TensorDict& request) override { requests_.send(cycle, {request}); }
  const torch::Tensor& answer(std::int64_t cycle) override { return answers_.recv(cycle).at("teacher_out"); }
  void release(std::int64_t cycle) override { answers_.release(cycle); }
  double wait_seconds() const override { return answers_.wait_seconds() + requests_.wait_seconds(); }

 private:
  comm::Sender& requests_;
  comm::Receiver& answers_;
};

/// What the dmd steps train besides the generator; owned by the caller.
struct DmdParts {
  StudentParts& generator;  ///< the student (its optimizer and reducer come with each step's context)
  StudentParts& critic;
  TrainOptimizer& critic_optimizer;  ///< whole, or under student.shard over the critic's slice
  comm::GradientReducer* critic_reducer = nullptr;  ///< null: alone
  RealScore& score;
  DmdSpec spec;
  comm::ServiceSchedule schedule;
  const TrainConfig& train;
  const DmdConfig& dmd;
  CheckpointPolicy policy;
  int world_rank = 0;
  /// The student group: a checkpoint gathers every student's request inputs to group rank 0.
  MPI_Comm students = MPI_COMM_SELF;
  double timeout_s = 120;
  std::vector<int> peers;              ///< world ranks of the other students (named on a timeout)
  comm::HealthChannel* health = nullptr;
  /// student.sequence_parallel: consecutive students of this many share each sample (and its
  /// request inputs, kept once a group in a checkpoint).
  int sequence_parallel = 1;
};

/// Losses of one dmd step (this rank's).
struct DmdLosses {
  double critic = 0;
  std::optional<double> generator;  ///< set at a generator update
};

/// The dmd training steps: each step updates the critic on the generator's samples for the
/// step's batch; the step that ends a cycle also updates the generator with the DMD gradient.
class DmdTrainer {
 public:
  explicit DmdTrainer(DmdParts parts) : p_(std::move(parts)) {}
  /// Step `step` with `batch` (context, context_lens; x_t and t for dmd_start data): the cycle's
  /// request at its request step, the critic update, the generator update (`generator`) at the
  /// cycle's end.
  DmdLosses step(StepContext& generator, std::int64_t step, const comm::TensorDict& batch);
  /// Whether step `step` (0-based) ends a cycle, i.e. updates the generator (train.critic_ratio).
  bool generator_step(std::int64_t step) const { return (step + 1) % p_.dmd.critic_ratio == 0; }
  /// Every student's request inputs of the cycle under way after `steps_done` steps, concatenated
  /// in group-rank order on group rank 0 (empty elsewhere, and between cycles); under
  /// student.sequence_parallel one copy a group, in group order. Collective over the student
  /// group, with the loop's deadline.
  TensorMap gather_pending(std::int64_t steps_done) const;
  /// The directory under a checkpoint that holds the critic's training state.
  static std::string critic_dir(const std::string& dir);
  /// The critic's training state (its parts, AdamW and, under student.shard, slice): saved into
  /// critic_dir() of every checkpoint through the trainables' one path (TrainableSave).
  Trainable critic_state() const { return {p_.critic, p_.critic_optimizer}; }
  /// Writes `pending` (gather_pending), when there is any, into `dir`/dmd_pending.safetensors.
  void write_pending(const std::string& dir, const TensorMap& pending) const;
  /// Restores what a checkpoint holds of dmd for a run resuming at schedule.first_step: the
  /// critic, and this student's share of the pending request inputs when the run resumes
  /// mid-cycle.
  void restore(const std::string& dir);

  /// The critic's weights, gradients and AdamW state (memory reports and the OOM diagnosis).
  memory::ModelMemory critic_memory() const;

  static constexpr const char* kCriticDir = "critic";
  static constexpr const char* kPendingFile = "dmd_pending.safetensors";

 private:
  void ask(std::int64_t step, const comm::TensorDict& batch);
  double update_critic(std::int64_t step, const comm::TensorDict& batch);
  double update_generator(StepContext& generator, std::int64_t step, const comm::TensorDict& batch);

  DmdParts p_;
  comm::TensorDict pending_;  ///< the current cycle's request inputs (copies)
  std::int64_t pending_cycle_ = -1;
};

/// dmd as the student's method: every step a critic update, the cycle's last also the
/// generator's (logged beside the critic's loss, which is the step's); the weight average follows
/// the generator's updates; the critic and the cycle's request inputs go into every checkpoint.
class DmdMethod final : public StudentMethod {
 public:
  /// `leader`: this rank logs the generator's losses (every train.log_every steps).
  DmdMethod(DmdTrainer& trainer, RealScore& score, const TrainConfig& train, bool leader)
      : trainer_(trainer), score_(score), train_(train), leader_(leader) {}
  double step(StepContext& context, std::int64_t step, double lr, MicroBatches& batches) override;
  bool averages_after(std::int64_t step) const override { return trainer_.generator_step(step); }
  double wait_seconds() const override { return score_.wait_seconds(); }
  memory::ModelMemory extra_memory() const override { return trainer_.critic_memory(); }
  void restore(const std::string& dir) override { trainer_.restore(dir); }
  std::unique_ptr<MethodCheckpoint> begin_save(std::int64_t steps_done) override;

 private:
  DmdTrainer& trainer_;
  RealScore& score_;
  const TrainConfig& train_;
  bool leader_;
};

}  // namespace wd::student
