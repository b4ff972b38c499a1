// The teacher's trajectories cut into the student's intervals (trajectory.hpp).
#include "teacher/trajectory.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <numeric>

#include "core/errors.hpp"
#include "data/flow_sampler.hpp"
#include "data/splitmix64.hpp"

namespace wd::teacher {

namespace {

// Draw streams of the trajectory objective (the noisers use 2-4, the schedule 1).
constexpr std::uint64_t kNoiseStream = 11;
constexpr std::uint64_t kDealStream = 12;

std::uint64_t round_key(std::uint64_t seed, std::uint64_t stream, bool eval, std::int64_t round, int replica) {
  return data::hash_keys(seed, stream, eval ? 1 : 0, static_cast<std::uint64_t>(round),
                         static_cast<std::uint64_t>(replica));
}

}  // namespace

void TrajectorySpec::validate(ConfigProblems& p) const {
  p.check(student_steps >= 1, "student.steps(" + std::to_string(student_steps) + ") must be >= 1");
  p.check(shift > 0, "teacher.shift(" + std::to_string(shift) + ") must be > 0");
  p.check(teacher_steps >= 1 && student_steps >= 1 && teacher_steps % student_steps == 0,
          "teacher.steps(" + std::to_string(teacher_steps) + ") must be a multiple of student.steps(" +
              std::to_string(student_steps) + "), so that the student's σ are points of the teacher's schedule");
}

std::vector<double> TrajectorySpec::teacher_sigmas() const { return data::sampling_sigmas(teacher_steps, shift); }

std::vector<double> TrajectorySpec::student_sigmas() const {
  const auto all = teacher_sigmas();
  std::vector<double> grid;
  for (std::int64_t i = 0; i <= student_steps; ++i) grid.push_back(all[static_cast<std::size_t>(i * stride())]);
  return grid;
}

std::vector<std::int64_t> TrajectorySpec::intervals_in(const data::TimestepRange& range) const {
  const auto sigmas = student_sigmas();
  std::vector<std::int64_t> out;
  std::string starts;
  for (std::int64_t i = 0; i < student_steps; ++i) {
    const float t = static_cast<float>(sigmas[static_cast<std::size_t>(i)] * 1000.0);
    if (range.contains(t)) out.push_back(i);
    starts += (i ? ", " : "") + std::to_string(t);
  }
  WD_CHECK_AS(ConfigError, !out.empty(),
              "none of the student's student.steps(" << student_steps << ") intervals (teacher.shift " << shift
                                                     << ": they start at t = " << starts << ") starts in "
                                                     << range.describe()
                                                     << ", the range of student.expert: raise student.steps");
  return out;
}

std::vector<std::int64_t> TrajectorySpec::trained() const {
  if (!intervals.empty()) return intervals;
  std::vector<std::int64_t> all(static_cast<std::size_t>(std::max<std::int64_t>(student_steps, 0)));
  std::iota(all.begin(), all.end(), 0);
  return all;
}

TrajectoryRounds::TrajectoryRounds(TrajectorySource source) : src_(source) {
  ConfigProblems p;
  src_.spec.validate(p);
  p.throw_if_any("trajectory objective");
  if (src_.stored) {
    const auto K = src_.stored->intervals();
    WD_CHECK_AS(ConfigError, K >= 1 && K % src_.spec.student_steps == 0 && src_.spec.teacher_steps % K == 0,
                "stored trajectories of " << K << " intervals serve students whose student.steps divides " << K
                                          << " (teacher.steps " << src_.spec.teacher_steps << "), not student.steps "
                                          << src_.spec.student_steps);
    WD_CHECK(src_.plan.feature_blocks.empty(), "stored trajectories hold no teacher features");
  } else {
    WD_CHECK(src_.stage, "trajectory rounds with neither a teacher stage nor stored trajectories");
    WD_CHECK(src_.stage->first() && src_.stage->last(),
             "train.objective trajectory samples with the whole teacher on one rank; this stage holds blocks "
                 << src_.stage->blocks().begin << "-" << src_.stage->blocks().end - 1);
  }
  WD_CHECK(src_.per_replica >= 1, "trajectory rounds of " << src_.per_replica << " trajectories");
  teacher_sigmas_ = src_.spec.teacher_sigmas();
  student_sigmas_ = src_.spec.student_sigmas();
  intervals_ = src_.spec.trained();
  for (const auto i : intervals_) {
    WD_CHECK(i >= 0 && i < src_.spec.student_steps, "trajectory interval " << i << " of " << src_.spec.student_steps);
  }
}

torch::Tensor TrajectoryRounds::timesteps(double sigma, std::int64_t batch) const {
  // The model's t is 1000·σ in fp32, as the noiser's; per-token layouts give every token the same t.
  auto t = torch::full({batch}, static_cast<float>(sigma * 1000.0), torch::kFloat);
  const auto S = src_.plan.per_token_seq_len;
  return S > 0 ? t.view({batch, 1}).expand({batch, S}).contiguous() : t;
}

const std::array<std::int64_t, 3>& TrajectoryRounds::patch() const {
  return src_.stage ? src_.stage->experts().front().model->config().patch_size : src_.patch;
}

ConditionedInput TrajectoryRounds::conditioned(ImageCondition kind, const torch::Tensor& image, const torch::Tensor& x,
                                               double sigma) const {
  return condition_input(kind, image, x, timesteps(sigma, x.size(0)), patch());
}

std::vector<std::int64_t> TrajectoryRounds::deal(std::int64_t round, bool eval) const {
  const auto n = src_.per_replica * static_cast<std::int64_t>(intervals_.size());
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  data::SplitMix64 rng(round_key(src_.seed, kDealStream, eval, round, src_.replica));
  for (std::int64_t i = n - 1; i > 0; --i) {  // Fisher-Yates
    const auto r = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(i + 1)));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(r)]);
  }
  return order;
}

std::pair<std::int64_t, std::int64_t> TrajectoryRounds::pair_at(std::int64_t round, bool eval, std::int64_t j) const {
  const auto m = static_cast<std::int64_t>(intervals_.size());
  const auto pair = deal(round, eval).at(static_cast<std::size_t>(j));
  return {pair / m, intervals_[static_cast<std::size_t>(pair % m)]};
}

TrajectoryRounds::Round TrajectoryRounds::read_round(std::int64_t round, bool eval) const {
  auto clean = src_.reader.read(
      replica_indices(src_.schedule, src_.replica, src_.replicas, src_.per_replica, src_.train_samples, round, eval));
  Round r;
  r.eval = eval;
  r.index = round;
  r.context = clean.context;
  r.context_lens = clean.context_lens;
  r.condition = clean.condition_kind;
  // Stored states are read to the host, and the round's image beside them.
  const auto device = src_.stage && !src_.stored ? src_.stage->experts().front().model->parameters().front().device()
                                                 : c10::Device(torch::kCPU);
  if (clean.condition.defined()) r.image = clean.condition.to(device);
  return r;
}

std::vector<torch::Tensor> TrajectoryRounds::sample_states(Round& r, std::int64_t steps, std::int64_t every,
                                                           bool features) const {
  const auto& l = src_.plan.latent;
  const auto device = src_.stage->experts().front().model->parameters().front().device();
  std::vector<torch::Tensor> noise;
  for (std::int64_t b = 0; b < src_.per_replica; ++b) {
    // One generator per trajectory: its noise does not depend on the batch's size or order.
    auto gen = at::detail::createCPUGenerator(
        data::hash_keys(round_key(src_.seed, kNoiseStream, r.eval, r.index, src_.replica), static_cast<std::uint64_t>(b)));
    noise.push_back(torch::randn({l[0], l[1], l[2], l[3]}, gen, torch::TensorOptions().dtype(torch::kFloat)));
  }
  // ti2v: the trajectories start from noise whose first frame is the image.
  torch::Tensor x = keep_condition(r.condition, r.image, torch::stack(noise).to(device));
  std::vector<torch::Tensor> states{x};
  data::FlowSampler sampler(src_.spec.solver, teacher_sigmas_);
  for (std::int64_t j = 0; j < steps; ++j) {
    StageBatch step;
    const auto in = conditioned(r.condition, r.image, x, sampler.sigma(j));
    step.x_t = in.x_t;
    step.t = in.t;
    step.y = in.y;
    step.context = r.context;
    step.context_lens = r.context_lens;
    src_.stage->run(step);
    if (!torch::isfinite(step.out).all().item<bool>()) {
      throw NumericalError("the teacher's velocity at step " + std::to_string(j) + " of trajectory round " +
                           std::to_string(r.index) + (r.eval ? " (held out)" : "") + " has NaN/Inf values");
    }
    if (features && j % every == 0) r.features.push_back(std::move(step.features));
    x = keep_condition(r.condition, r.image, sampler.step(j, x, step.out).to(torch::kFloat));
    if ((j + 1) % every == 0) states.push_back(x);
  }
  return states;
}

void TrajectoryRounds::sample_round(std::int64_t round, bool eval) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto last = intervals_.back() + 1;  // the teacher samples as far as the last trained interval's end
  Round r = read_round(round, eval);
  if (src_.stored) {
    // The stored states at the student's σ: every (K / k)-th of the K + 1 stored.
    const auto all = src_.stored->round(round, eval);
    const auto every = src_.stored->intervals() / src_.spec.student_steps;
    for (std::int64_t i = 0; i <= last; ++i) r.states.push_back(all[i * every]);
  } else {
    r.states = sample_states(r, last * src_.spec.stride(), src_.spec.stride(), true);
  }
  WD_CHECK(static_cast<std::int64_t>(r.states.size()) == last + 1,
           "trajectory round kept " << r.states.size() << " states for " << last << " intervals");
  r.order = deal(round, eval);
  round_ = std::move(r);
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

torch::Tensor TrajectoryRounds::whole_round(std::int64_t round, bool eval, std::int64_t keep) {
  WD_CHECK(src_.stage, "trajectory rounds: whole trajectories are sampled by a teacher stage");
  WD_CHECK_AS(ConfigError, keep >= 1 && src_.spec.teacher_steps % keep == 0,
              "generate --keep(" << keep << ") must divide teacher.steps(" << src_.spec.teacher_steps << ")");
  const auto t0 = std::chrono::steady_clock::now();
  Round r = read_round(round, eval);
  const auto states = sample_states(r, src_.spec.teacher_steps, src_.spec.teacher_steps / keep, false);
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return torch::stack(states).to(torch::kCPU);
}

StageBatch TrajectoryRounds::make(std::int64_t position, bool eval) {
  const auto m = static_cast<std::int64_t>(intervals_.size());
  const auto round = position / m, slot = position % m;
  if (round_.index != round || round_.eval != eval) sample_round(round, eval);
  const auto B = src_.per_replica;
  std::vector<std::int64_t> traj, interval;
  for (std::int64_t j = slot * B; j < (slot + 1) * B; ++j) {
    const auto pair = round_.order[static_cast<std::size_t>(j)];
    traj.push_back(pair / m);
    interval.push_back(intervals_[static_cast<std::size_t>(pair % m)]);
  }
  const auto traj_idx = torch::tensor(traj, torch::kLong);
  std::vector<torch::Tensor> x, target, t, start, y;
  std::map<std::int64_t, std::vector<torch::Tensor>> features;
  for (std::int64_t s = 0; s < B; ++s) {
    const auto b = traj[static_cast<std::size_t>(s)], i = interval[static_cast<std::size_t>(s)];
    const auto& from = round_.states[static_cast<std::size_t>(i)][b];
    const auto& to = round_.states[static_cast<std::size_t>(i + 1)][b];
    const double s0 = student_sigmas_[static_cast<std::size_t>(i)], s1 = student_sigmas_[static_cast<std::size_t>(i + 1)];
    x.push_back(from);
    if (src_.plan.start_states) start.push_back(round_.states.front()[b]);
    target.push_back((to - from) / (s1 - s0));
    const auto image = round_.image.defined() ? round_.image.narrow(0, b, 1) : round_.image;
    const auto in = conditioned(round_.condition, image, from.unsqueeze(0), s0);
    t.push_back(in.t[0]);
    if (in.y.defined()) y.push_back(in.y[0]);
    if (round_.features.empty()) continue;  // stored trajectories: no features
    for (const auto& [block, h] : round_.features[static_cast<std::size_t>(i)]) features[block].push_back(h[b]);
  }
  StageBatch out;
  out.x_t = torch::stack(x);
  out.out = torch::stack(target);
  out.t = torch::stack(t);  // on the host, as the noiser's t of the other objectives
  out.context = round_.context.index_select(0, traj_idx.to(round_.context.device()));
  out.context_lens = round_.context_lens.index_select(0, traj_idx);
  for (auto& [block, hs] : features) out.features[block] = torch::stack(hs);
  if (!start.empty()) out.start = torch::stack(start);
  if (!y.empty()) out.y = torch::stack(y);
  return out;
}

}  // namespace wd::teacher
