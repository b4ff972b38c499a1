// train.objective dmd: the generator's samples, the DMD gradient, the critic and generator updates.
#include "student/dmd.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

#include "comm/mpi_check.hpp"
#include "comm/mpi_runtime.hpp"
#include "core/errors.hpp"
#include "core/sequence_groups.hpp"
#include "data/flow_sampler.hpp"
#include "data/splitmix64.hpp"
#include "model/image_condition.hpp"
#include "model/safetensors.hpp"
#include "student/train_state.hpp"

namespace wd::student {

namespace {

namespace fs = std::filesystem;

// Seed domains: the critic's samples and re-noising per step, the generator's per cycle.
constexpr std::uint64_t kSampleSalt = 0xD3D0'5A3EULL;
constexpr std::uint64_t kCriticSalt = 0xC817'1C00ULL;
constexpr std::uint64_t kDmdSalt = 0xD3D0'0D3DULL;
constexpr std::uint64_t kGanSalt = 0x6A40'FA4EULL;

std::int64_t critic_key(std::int64_t step) { return 2 * step; }
std::int64_t generator_key(std::int64_t cycle) { return 2 * cycle + 1; }

/// The request inputs of a batch: what generate() reads, t for the generator's GAN term, and the
/// image condition: an i2v teacher's y, and with per-token t (ti2v) x_t and t, whose clean first
/// frames the generator's samples keep (copies: the batch's slot is reused).
comm::TensorDict request_inputs(const comm::TensorDict& batch, bool simulate, bool gan) {
  comm::TensorDict in;
  const bool per_token = batch.at("t").dim() == 2;
  for (const char* name : {"context", "context_lens", "x_t", "t"}) {
    if (simulate && !per_token && name == std::string("x_t")) continue;
    if (simulate && !per_token && !gan && name == std::string("t")) continue;
    in[name] = batch.at(name).clone();
  }
  if (const auto y = batch.find("y"); y != batch.end()) in["y"] = y->second.clone();
  return in;
}

/// A model's inputs at (x, t) with the contexts of `in`, and its image condition y when it has one.
comm::TensorDict model_inputs(const torch::Tensor& x, const torch::Tensor& t, const comm::TensorDict& in) {
  comm::TensorDict out{{"x_t", x}, {"t", t}, {"context", in.at("context")}, {"context_lens", in.at("context_lens")}};
  if (const auto y = in.find("y"); y != in.end()) out["y"] = y->second;
  return out;
}

/// The critic's flow-matching loss on the generator's samples of one batch.
class CriticObjective final : public Objective {
 public:
  CriticObjective(DmdParts& p, std::int64_t step) : p_(p), step_(step) {}
  const std::vector<torch::Tensor>& parameters() const override { return p_.critic.trainable(); }
  void zero_grad() override { p_.critic.zero_grad(); }
  torch::Tensor backward(const comm::TensorDict& batch, double scale) override {
    const auto x0 = generate(p_.generator, batch, p_.spec, critic_key(step_), false, p_.policy);
    const auto n = renoise(x0, p_.spec, step_, kCriticSalt, CleanFrames(p_.generator, batch));
    auto in = model_inputs(n.x, n.t, batch);
    in["teacher_out"] = n.noise - x0;  // the flow of the generator's samples
    auto total = p_.critic.micro_step(in, scale, p_.policy).total;
    if (p_.dmd.gan()) total = total + classify(batch, x0, scale);
    return total;
  }
  void after_step() override { p_.critic.after_optimizer_step(); }

 private:
  /// The realism classifier's step: the batch's x_t (real) against the generator's samples noised
  /// to the same t (fake), in one forward of both.
  torch::Tensor classify(const comm::TensorDict& batch, const torch::Tensor& x0, double scale) {
    const auto& t = batch.at("t");
    const CleanFrames clean(p_.generator, batch);
    const auto noise = seeded_noise(x0, p_.spec, critic_key(step_), kGanSalt);
    const auto fake = clean.keep(noised_to(x0, sample_timesteps(t), noise));
    const auto& context = batch.at("context");
    const auto& lens = batch.at("context_lens");
    comm::TensorDict both{{"x_t", torch::cat({batch.at("x_t").to(fake.scalar_type()), fake})},
                          {"t", torch::cat({t, t})},
                          {"context", torch::cat({context, context})},
                          {"context_lens", torch::cat({lens, lens})}};
    if (const auto y = batch.find("y"); y != batch.end()) both["y"] = torch::cat({y->second, y->second});
    const auto logits = p_.critic.realism(both, p_.policy);
    const auto b = x0.size(0);
    const auto loss = p_.dmd.critic_gan_weight * classifier_loss(logits.narrow(0, 0, b), logits.narrow(0, b, b));
    p_.critic.backward(loss * scale);
    return loss.detach().to(torch::kFloat);
  }

  DmdParts& p_;
  std::int64_t step_;
};

/// The generator's DMD loss for its cycle's request, with the teacher's answer.
class GeneratorObjective final : public Objective {
 public:
  /// `regression`: the step's trajectory batch, whose jump target the generator also regresses
  /// to with train.dmd_regression_weight; null = none.
  GeneratorObjective(DmdParts& p, std::int64_t cycle, const torch::Tensor& real_velocity,
                     const comm::TensorDict* regression)
      : p_(p), cycle_(cycle), real_(real_velocity), regression_(regression) {}
  const std::vector<torch::Tensor>& parameters() const override { return p_.generator.trainable(); }
  void zero_grad() override { p_.generator.zero_grad(); }
  torch::Tensor backward(const comm::TensorDict& in, double scale) override {
    // The generator is unchanged since the request: x0 has the request's values, now with a graph.
    const auto x0 = generate(p_.generator, in, p_.spec, generator_key(cycle_), true, p_.policy);
    const auto& x = in.at("dmd.x");
    const auto sigma = in.at("dmd.sigma");
    const auto real_x0 = x - sigma * real_.to(x.scalar_type());
    const auto fake_x0 = x - sigma * p_.critic.predict(model_inputs(x, in.at("dmd.t"), in));
    // A clean image frame (ti2v) is the condition, not the generator's: no gradient there.
    const auto still = p_.generator.frame_weights({{"t", in.at("dmd.t")}, {"x_t", x}});
    auto loss = dmd_loss(x0, dmd_gradient(x0.detach(), real_x0, fake_x0, still));
    if (regression_) {
      const auto& b = *regression_;
      loss = loss + p_.dmd.regression_weight *
                        distill_loss(p_.generator.forward_train(model_inputs(b.at("x_t"), b.at("t"), b), p_.policy),
                                     b.at("teacher_out"), p_.generator.frame_weights(b));
    }
    if (p_.dmd.gan_weight > 0) {
      // DMD2's generator GAN loss through the critic's classifier, at the request batch's noise levels.
      const auto noise = seeded_noise(x0, p_.spec, generator_key(cycle_), kGanSalt);
      const auto g = gan_gradient(p_.critic, x0.detach(), in.at("t"), noise, in, p_.policy,
                                  CleanFrames(p_.generator, in));
      loss = loss + p_.dmd.gan_weight * (x0 * g).sum();  // its gradient in x0: gan_weight · g
    }
    p_.generator.backward(loss * scale);
    return loss.detach().to(torch::kFloat);
  }
  void after_step() override { p_.generator.after_optimizer_step(); }

 private:
  DmdParts& p_;
  std::int64_t cycle_;
  const torch::Tensor& real_;
  const comm::TensorDict* regression_;
};

}  // namespace

DmdSpec DmdSpec::from(const TrainConfig& train, const DmdConfig& dmd, const std::array<std::int64_t, 4>& latent,
                      int student) {
  DmdSpec s;
  s.sigmas = data::sampling_sigmas(train.sample_steps, train.sample_shift);
  s.simulate = dmd.simulate();
  s.t_min = dmd.t_min;
  s.t_max = dmd.t_max;
  s.shift = train.sample_shift;
  s.seed = train.seed;
  s.student = static_cast<std::uint64_t>(student);
  s.latent = latent;
  return s;
}

at::Generator DmdSpec::generator(std::uint64_t salt, std::int64_t key) const {
  return at::detail::createCPUGenerator(data::hash_keys(seed, salt, key, student));
}

CleanFrames::CleanFrames(const StudentParts& model, const comm::TensorDict& batch) {
  const auto t = batch.find("t");
  const auto x = batch.find("x_t");
  if (t == batch.end() || x == batch.end() || t->second.dim() != 2) return;
  like_ = t->second;
  clean_ = x->second;
  weights_ = model.frame_weights(batch);
}

torch::Tensor CleanFrames::keep(const torch::Tensor& x) const { return keep_clean_frames(x, clean_, weights_); }

torch::Tensor CleanFrames::timesteps(const torch::Tensor& t) const {
  return like_.defined() ? timesteps_like(like_, t) : t;
}

torch::Tensor CleanFrames::timesteps_at(double sigma, std::int64_t batch, const c10::Device& device) const {
  if (like_.defined()) return wd::timesteps_at(like_, sigma).to(device);
  return torch::full({batch}, 1000.0 * sigma, torch::TensorOptions().dtype(torch::kFloat).device(device));
}

torch::Tensor generate(StudentParts& generator, const comm::TensorDict& inputs, const DmdSpec& spec,
                       std::int64_t key, bool grad, const CheckpointPolicy& policy) {
  const auto batch = inputs.at("context").size(0);
  const CleanFrames clean(generator, inputs);
  const auto jump = [&](const torch::Tensor& x, const torch::Tensor& t, bool keep) {
    const auto in = model_inputs(x, t, inputs);
    return keep ? generator.forward_train(in, policy) : generator.predict(in);
  };
  if (!spec.simulate) {  // one jump from the stream's noised data
    const auto& x_t = inputs.at("x_t");
    const auto& t = inputs.at("t");
    return clean.keep(x_t - (sample_timesteps(t) / 1000.0).view({batch, 1, 1, 1, 1}) * jump(x_t, t, grad));
  }
  auto gen = spec.generator(kSampleSalt, key);
  const auto [c, f, h, w] = spec.latent;
  auto x = clean.keep(torch::randn({batch, c, f, h, w}, gen).to(generator.device()));
  const auto k = spec.sigmas.size() - 1;
  for (std::size_t i = 0; i < k; ++i) {
    const auto t = clean.timesteps_at(spec.sigmas[i], batch, generator.device());
    // σ_k = 0: the last jump lands on x0.
    x = clean.keep(x + (spec.sigmas[i + 1] - spec.sigmas[i]) * jump(x, t, grad && i + 1 == k));
  }
  return x;
}

Renoised renoise(const torch::Tensor& x0, const DmdSpec& spec, std::int64_t key, std::uint64_t salt,
                 const CleanFrames& clean) {
  const auto batch = x0.size(0);
  auto gen = spec.generator(salt, key);
  const auto u = torch::rand({batch}, gen, torch::kDouble) * (spec.t_max - spec.t_min) + spec.t_min;
  const auto sigma = spec.shift * u / (1.0 + (spec.shift - 1.0) * u);  // Wan's shifted schedule
  const auto noise = torch::randn(x0.sizes(), gen, torch::kFloat).to(x0.device());
  Renoised r;
  r.sigma = sigma.to(torch::kFloat).to(x0.device()).view({batch, 1, 1, 1, 1});
  r.noise = noise;
  r.x = clean.keep((1.0 - r.sigma) * x0.detach() + r.sigma * noise);
  r.t = clean.timesteps((sigma * 1000.0).to(torch::kFloat).to(x0.device()));
  return r;
}

torch::Tensor dmd_gradient(const torch::Tensor& x0, const torch::Tensor& real_x0, const torch::Tensor& fake_x0,
                           const torch::Tensor& weights) {
  torch::NoGradGuard no_grad;
  std::vector<std::int64_t> dims;
  for (std::int64_t d = 1; d < x0.dim(); ++d) dims.push_back(d);
  if (!weights.defined()) {
    const auto weight = (x0 - real_x0).abs().mean(dims, /*keepdim=*/true);
    return torch::nan_to_num((fake_x0 - real_x0) / weight, 0.0, 0.0, 0.0);
  }
  const auto w = weights.to(x0.scalar_type()).expand_as(x0);
  const auto weight = ((x0 - real_x0).abs() * w).sum(dims, /*keepdim=*/true) / w.sum(dims, /*keepdim=*/true);
  return torch::nan_to_num((fake_x0 - real_x0) * w / weight, 0.0, 0.0, 0.0);
}

torch::Tensor dmd_loss(const torch::Tensor& x0, const torch::Tensor& grad) {
  return 0.5 * torch::mse_loss(x0, (x0 - grad).detach());
}

torch::Tensor seeded_noise(const torch::Tensor& x0, const DmdSpec& spec, std::int64_t key, std::uint64_t salt) {
  auto gen = spec.generator(salt, key);
  return torch::randn(x0.sizes(), gen, torch::kFloat).to(x0.device());
}

torch::Tensor noised_to(const torch::Tensor& x0, const torch::Tensor& t, const torch::Tensor& noise) {
  auto shape = std::vector<std::int64_t>(static_cast<std::size_t>(x0.dim()), 1);
  shape[0] = x0.size(0);
  const auto sigma = (t.to(torch::kFloat) / 1000.0).view(shape);
  return (1.0 - sigma) * x0 + sigma * noise.to(x0.scalar_type());
}

torch::Tensor classifier_loss(const torch::Tensor& real_logits, const torch::Tensor& fake_logits) {
  return torch::softplus(fake_logits).mean() + torch::softplus(-real_logits).mean();
}

torch::Tensor gan_gradient(StudentParts& critic, const torch::Tensor& x0, const torch::Tensor& t,
                           const torch::Tensor& noise, const comm::TensorDict& in, const CheckpointPolicy& policy,
                           const CleanFrames& clean) {
  torch::AutoGradMode grad_on(true);
  const auto leaf = x0.detach().requires_grad_(true);
  const auto logits = critic.realism(model_inputs(clean.keep(noised_to(leaf, sample_timesteps(t), noise)), t, in), policy);
  const auto loss = torch::softplus(-logits).mean();
  const auto g = torch::autograd::grad({loss}, {leaf})[0].detach();
  auto* group = critic.sequence_parallel();
  if (!group) return g;
  // Each rank holds the gradient of its own tokens' patches (zero elsewhere), N times over: every
  // rank differentiated the same logits, and the pooling's backward adds the group's gradients.
  return group->sum(g) / static_cast<double>(group->size());
}

void DmdTrainer::ask(std::int64_t step, const comm::TensorDict& batch) {
  const auto cycle = p_.schedule.cycle_of(step);
  if (pending_cycle_ != cycle) {  // a resumed run restored its cycle's inputs instead
    pending_ = request_inputs(batch, p_.spec.simulate, p_.dmd.gan_weight > 0);
    pending_cycle_ = cycle;
  }
  const auto x0 = generate(p_.generator, pending_, p_.spec, generator_key(cycle), false, p_.policy);
  const auto n = renoise(x0, p_.spec, cycle, kDmdSalt, CleanFrames(p_.generator, pending_));
  pending_["dmd.x"] = n.x;
  pending_["dmd.t"] = n.t;
  pending_["dmd.sigma"] = n.sigma;
  p_.score.ask(cycle, model_inputs(n.x, n.t, pending_));
}

double DmdTrainer::update_critic(std::int64_t step, const comm::TensorDict& batch) {
  CriticObjective objective(p_, step);
  StepContext ctx{objective, p_.critic_optimizer, p_.critic_reducer, p_.train.grad_clip, p_.world_rank, {}};
  FixedBatches batches({batch});
  return train_step(ctx, step, p_.dmd.critic_lr_at(p_.train.lr_at(step), p_.train.lr), batches);
}

double DmdTrainer::update_generator(StepContext& generator, std::int64_t step, const comm::TensorDict& batch) {
  const auto cycle = p_.schedule.cycle_of(step);
  WD_CHECK(pending_cycle_ == cycle, "dmd: the generator update of step " << step + 1 << " has no request of cycle "
                                                                         << cycle << " (pending: " << pending_cycle_
                                                                         << ")");
  GeneratorObjective objective(p_, cycle, p_.score.answer(cycle),
                               p_.dmd.regression_weight > 0 ? &batch : nullptr);
  StepContext ctx{objective,           generator.optimizer,  generator.reducer, generator.grad_clip,
                  generator.world_rank, generator.after_step};
  FixedBatches batches({pending_});
  const double loss = train_step(ctx, step, p_.train.lr_at(step), batches);
  p_.score.release(cycle);
  pending_.clear();
  pending_cycle_ = -1;
  return loss;
}

memory::ModelMemory DmdTrainer::critic_memory() const {
  return model_memory(p_.critic.trainable(), p_.critic_optimizer.shard(), p_.critic_optimizer.adamw());
}

DmdLosses DmdTrainer::step(StepContext& generator, std::int64_t step, const comm::TensorDict& batch) {
  if (p_.schedule.asks_at(step)) ask(step, batch);
  DmdLosses losses;
  losses.critic = update_critic(step, batch);
  if (p_.schedule.generator_step(step)) losses.generator = update_generator(generator, step, batch);
  return losses;
}

TensorMap DmdTrainer::gather_pending(std::int64_t steps_done) const {
  TensorMap out;
  const auto cycle = p_.schedule.cycle_of(steps_done);
  if (steps_done % p_.schedule.ratio == 0 || cycle >= p_.schedule.end_cycle()) return out;  // between cycles
  WD_CHECK(pending_cycle_ == cycle, "dmd: no request inputs of cycle " << cycle << " to checkpoint");
  int size = 1, rank = 0;
  MPI_Comm_size(p_.students, &size);
  MPI_Comm_rank(p_.students, &rank);
  const int n = p_.sequence_parallel;  // a group's ranks hold the same inputs: its first rank's are kept
  for (const auto& [name, t] : pending_) {
    if (name.rfind("dmd.", 0) == 0) continue;  // recomputed from the rest
    const auto mine = t.detach().cpu().contiguous();
    auto sizes = mine.sizes().vec();
    sizes[0] *= size;
    // Kept until exit if a wait is abandoned (MPI may still write into it).
    auto all = torch::empty(sizes, mine.options());
    const auto bytes = static_cast<int>(mine.nbytes());
    MPI_Request req;
    WD_CHECK_MPI(MPI_Igather(mine.data_ptr(), bytes, MPI_BYTE, all.data_ptr(), bytes, MPI_BYTE, 0, p_.students, &req));
    try {
      comm::wait_with_deadline(req, {"gather dmd request inputs", steps_done, mine.nbytes(), p_.peers},
                               std::chrono::duration<double>(p_.timeout_s), p_.world_rank, p_.health);
    } catch (...) {
      comm::keep_until_exit(all);
      comm::keep_until_exit(mine);
      throw;
    }
    if (rank == 0) {  // [groups, n, rows, ...]: each group's first rank's rows (all of them when n is 1)
      std::vector<std::int64_t> grouped{SequenceGroups{n}.groups_in(size), n, mine.size(0)};
      grouped.insert(grouped.end(), sizes.begin() + 1, sizes.end());
      out[name] = all.view(grouped).select(1, 0).flatten(0, 1).contiguous();
    }
  }
  return out;
}

std::string DmdTrainer::critic_dir(const std::string& dir) { return (fs::path(dir) / kCriticDir).string(); }

void DmdTrainer::write_pending(const std::string& dir, const TensorMap& pending) const {
  if (pending.empty()) return;
  write_safetensors((fs::path(dir) / kPendingFile).string(), pending,
                    {{"cycle", std::to_string(pending_cycle_)}, {"producer", "wan-distill train (dmd)"}});
}

void DmdTrainer::restore(const std::string& dir) {
  const auto critic_dir = (fs::path(dir) / kCriticDir).string();
  WD_CHECK_DATA(fs::is_directory(critic_dir), dir, kCriticDir,
                "is missing: a train.objective dmd checkpoint holds the critic's training state there");
  const auto first = p_.schedule.first_step;
  critic_state().restore(critic_dir, first, "the generator's");
  const auto cycle = p_.schedule.cycle_of(first);
  if (first % p_.schedule.ratio == 0 || cycle >= p_.schedule.end_cycle()) return;
  const auto path = (fs::path(dir) / kPendingFile).string();
  WD_CHECK_DATA(fs::exists(path), dir, kPendingFile,
                "is missing: step " << first << " is inside critic cycle " << cycle
                                    << ", whose generator request inputs the checkpoint must hold");
  const auto file = SafetensorsFile::open(path);
  int students = 1, index = 0;
  MPI_Comm_size(p_.students, &students);
  MPI_Comm_rank(p_.students, &index);
  // Rows by data-parallel group: a sequence-parallel group's ranks each take its rows.
  const SequenceGroups groups{p_.sequence_parallel};
  const int size = groups.groups_in(students), rank = groups.group_of(index);
  pending_.clear();
  for (const auto& info : file.tensors()) {
    WD_CHECK_DATA(!info.shape.empty() && info.shape[0] % size == 0, path, info.name,
                  "has " << (info.shape.empty() ? 0 : info.shape[0]) << " rows, not a multiple of the " << size
                         << (p_.sequence_parallel > 1 ? " sequence-parallel groups" : " students")
                         << " that resume from it");
    const auto rows = info.shape[0] / size;
    // This student's rows, copied off the mapping (which closes with `file`).
    const auto t = file.tensor(info.name).slice(0, rank * rows, (rank + 1) * rows).clone();
    pending_[info.name] = comm::host_resident(info.name) ? t : t.to(p_.generator.device());
  }
  // The inputs the generator step will read: the contexts, and the noise levels where the data
  // start or the GAN term reads them.
  std::vector<std::string> needed{"context", "context_lens"};
  if (p_.dmd.gan_weight != 0 || !p_.spec.simulate) needed.emplace_back("t");
  for (const auto& name : needed) {
    WD_CHECK_DATA(pending_.count(name), path, name,
                  "is missing (the request inputs of cycle " << cycle << (name == "t" ? "; the generator step reads "
                  "their noise levels (train.dmd_start data, train.gan_weight): resume from a checkpoint at a cycle's "
                  "end" : "") << ")");
  }
  pending_cycle_ = cycle;
}

double DmdMethod::step(StepContext& context, std::int64_t step, double /*lr: the trainer's own*/,
                       MicroBatches& batches) {
  const auto losses = trainer_.step(context, step, batches.take(step, 0));
  batches.release(step, 0);
  if (losses.generator && leader_ && (step + 1) % train_.log_every == 0) {
    spdlog::info("dmd step {}: generator loss {:.5f} (this rank), critic loss {:.5f}", step + 1, *losses.generator,
                 losses.critic);
  }
  return losses.critic;
}

namespace {

/// dmd's share of a checkpoint: the critic's training state, through the trainables' one path
/// (whole while it is written under student.shard parameters; each student's moment slice under
/// student.shard), and the cycle's request inputs gathered from every student when the
/// checkpoint falls inside a cycle.
class DmdCheckpoint final : public MethodCheckpoint {
 public:
  DmdCheckpoint(const DmdTrainer& trainer, std::int64_t steps_done)
      : trainer_(trainer), critic_(trainer.critic_state(), steps_done), pending_(trainer.gather_pending(steps_done)) {}
  bool sliced() const override { return critic_.sliced(); }
  void write(const std::string& dir, const std::string& config_ini) override {
    const auto critic_dir = DmdTrainer::critic_dir(dir);
    fs::create_directories(critic_dir);
    critic_.write(critic_dir, config_ini, /*export_student=*/false);
    trainer_.write_pending(dir, pending_);
  }
  void write_slice(const std::string& dir) override { critic_.write_slice(DmdTrainer::critic_dir(dir)); }

 private:
  const DmdTrainer& trainer_;
  TrainableSave critic_;
  TensorMap pending_;
};

}  // namespace

std::unique_ptr<MethodCheckpoint> DmdMethod::begin_save(std::int64_t steps_done) {
  return std::make_unique<DmdCheckpoint>(trainer_, steps_done);
}

}  // namespace wd::student
