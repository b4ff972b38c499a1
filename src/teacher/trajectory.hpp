// train.objective trajectory: few-step distillation on the teacher's own ODE paths. The teacher
// samples from seeded noise along a schedule that contains the student's k-step grid, and each
// student interval [σ_i, σ_{i+1}] becomes one training sample: the teacher's state at σ_i and
// the velocity that jumps exactly to its state at σ_{i+1} (docs/objectives.md#trajectory).
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm/stream_plan.hpp"
#include "core/choices.hpp"
#include "core/config.hpp"
#include "data/dataset_reader.hpp"
#include "data/noiser.hpp"
#include "data/sample_schedule.hpp"
#include "teacher/target_source.hpp"
#include "model/image_condition.hpp"
#include "teacher/teacher_stage.hpp"

namespace wd::teacher {

/// The two schedules of a trajectory objective: the teacher's `teacher_steps` (the official
/// sampling schedule, data::sampling_sigmas) and the student's `student_steps` k, the same
/// schedule at k steps. With teacher_steps a multiple of k the student's σ are exactly the
/// teacher's σ at every (teacher_steps / k)-th step, so no state is interpolated.
struct TrajectorySpec {
  Solver solver = Solver::kUnipc;   ///< the teacher's sampler
  std::int64_t teacher_steps = 40;  ///< teacher.steps
  std::int64_t student_steps = 4;   ///< student.steps (k)
  double shift = 5.0;               ///< teacher.shift (the student samples with the same)
  /// The student intervals that are trained, ascending (student.expert: those that start in the
  /// expert's t range); empty = all k.
  std::vector<std::int64_t> intervals;

  /// Problems of the spec, named by their keys.
  void validate(ConfigProblems& p) const;
  std::vector<double> teacher_sigmas() const;
  std::vector<double> student_sigmas() const;
  /// The intervals of `range`: i such that the model timestep of σ_i (fp32 1000·σ_i, as the
  /// batches carry it) lies in it; throws ConfigError when none does.
  std::vector<std::int64_t> intervals_in(const data::TimestepRange& range) const;
  /// `intervals`, or 0..k-1 when empty.
  std::vector<std::int64_t> trained() const;
  /// Teacher steps per student interval.
  std::int64_t stride() const { return teacher_steps / student_steps; }
};

/// Whole trajectories stored once (a teacher cache of trajectories, `generate --keep`,
/// teacher_cache.hpp) that TrajectoryRounds reads a round's states from instead of sampling them:
/// each trajectory's state at every (teacher.steps / intervals())-th teacher step, from its noise on.
class StoredTrajectories {
 public:
  virtual ~StoredTrajectories() = default;
  /// K, the intervals stored: K + 1 states a trajectory.
  virtual std::int64_t intervals() const = 0;
  /// The states of round `round` of this replica's trajectories (held out when `eval`), the
  /// round's B trajectories along the second dimension: [K + 1, B, C, F, H, W], on the host.
  virtual torch::Tensor round(std::int64_t round, bool eval) = 0;
};

/// What the trajectories are computed from; owned by the caller.
struct TrajectorySource {
  /// The whole teacher (guidance set on it when the target is guided); null where `stored` holds
  /// the trajectories.
  TeacherStage* stage = nullptr;
  data::DatasetReader& reader;
  const data::SampleSchedule& schedule;  ///< batch_per_replica = `per_replica`
  const comm::StreamPlan& plan;
  TrajectorySpec spec;
  int replica = 0;
  int replicas = 1;
  std::int64_t per_replica = 1;     ///< trajectories of a round = samples of one batch
  std::int64_t train_samples = 0;   ///< held-out contexts follow these in the file
  std::uint64_t seed = 0;           ///< train.seed: the noises and the order of the pairs
  /// Where the rounds' states are read instead of sampled (null: the stage samples them). Its
  /// K must be a multiple of spec.student_steps, and teacher_steps of K.
  StoredTrajectories* stored = nullptr;
  std::array<std::int64_t, 3> patch{1, 2, 2};  ///< the DiT's patch where there is no stage
};

/// The batches of one replica's trajectory stream. Positions are grouped in rounds of m (the m
/// trained intervals, spec.trained(); k unless student.expert cuts them): round r samples B =
/// per_replica trajectories, from noise seeded by (seed, round, replica, b) and the contexts of
/// batch r of the sample schedule (held-out rounds: of eval_indices(r)), as far as the last
/// trained interval's end, which gives B·m (trajectory, interval) pairs; a seeded permutation of
/// them deals B pairs to each of the round's m positions, so every batch mixes intervals and
/// trajectories. A batch depends on its position only: a resumed run recomputes its round and
/// gets the same batches.
class TrajectoryRounds final : public TargetSource {
 public:
  /// The stage must be the whole teacher (one rank holds every block), or `stored` hold the
  /// trajectories (then no teacher features are made).
  explicit TrajectoryRounds(TrajectorySource source);
  /// The batch of training stream position `position` (eval = false) or of held-out message
  /// `position` (eval = true): x_t = the teacher's state at σ_i, t = 1000·σ_i ([B] or, per-token
  /// layouts, [B,S]), context, out = (x_{i+1} − x_i) / (σ_{i+1} − σ_i), and the teacher's
  /// features at (x_i, σ_i) when plan.feature_blocks asks for them. With an image condition in
  /// the data set, the trajectories are conditioned: i2v batches carry y, ti2v states keep the
  /// image as their first frame, at t = 0 (condition_input).
  StageBatch make(std::int64_t position, bool eval) override;
  /// Round `round`'s B trajectories sampled by the stage to their end (all teacher.steps), kept
  /// as a StoredTrajectories stores them: the noise, then the state after every
  /// (teacher.steps / `keep`)-th step, [keep + 1, B, C, F, H, W] on the host. A TrajectoryRounds
  /// reading them back makes the batches this one makes (the same states, contexts and deal).
  torch::Tensor whole_round(std::int64_t round, bool eval, std::int64_t keep);
  /// Seconds spent sampling trajectories.
  double sampling_seconds() const { return seconds_; }
  /// Round `round`'s deal: place j -> pair b·m + n (trajectory b, trained interval n); places
  /// [s·B, (s+1)·B) are the batch of the round's position s.
  std::vector<std::int64_t> deal(std::int64_t round, bool eval) const;
  /// Which (trajectory, interval) pair sits at place `j` of round `round`'s deal (for tests: it
  /// deals the whole round on every call).
  std::pair<std::int64_t, std::int64_t> pair_at(std::int64_t round, bool eval, std::int64_t j) const;

 private:
  struct Round {
    bool eval = false;
    std::int64_t index = -1;
    /// noise, then the state at each σ_i up to the last trained interval's end ([B,C,F,H,W])
    std::vector<torch::Tensor> states;
    std::vector<std::map<std::int64_t, torch::Tensor>> features;  ///< features at (x_i, σ_i)
    torch::Tensor context, context_lens;
    /// The data set's image condition of the round's trajectories (undefined: none) and how the
    /// teacher takes it: i2v's y at every forward, ti2v's first frame clean throughout.
    torch::Tensor image;
    ImageCondition condition = ImageCondition::kNone;
    std::vector<std::int64_t> order;  ///< the deal: place j -> pair b·m + n
  };
  /// Round `round`'s contexts and image condition read (no states yet).
  Round read_round(std::int64_t round, bool eval) const;
  /// The stage's trajectories of `r` from their seeded noise for `steps` teacher steps: the noise,
  /// then the state after every `every`-th step (the features at each kept state's (x_i, σ_i)
  /// into r.features when `features`).
  std::vector<torch::Tensor> sample_states(Round& r, std::int64_t steps, std::int64_t every, bool features) const;
  void sample_round(std::int64_t round, bool eval);
  torch::Tensor timesteps(double sigma, std::int64_t batch) const;
  /// The teacher's (or the student's) input at state `x` at σ of trajectories that `image`
  /// conditions as `kind` takes it (condition_input on timesteps(σ)).
  ConditionedInput conditioned(ImageCondition kind, const torch::Tensor& image, const torch::Tensor& x,
                               double sigma) const;
  /// The teacher's patch (its per-token timesteps' grid).
  const std::array<std::int64_t, 3>& patch() const;

  TrajectorySource src_;
  std::vector<double> teacher_sigmas_, student_sigmas_;
  std::vector<std::int64_t> intervals_;  ///< spec.trained()
  Round round_;
  double seconds_ = 0;
};

}  // namespace wd::teacher
