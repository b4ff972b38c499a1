// dump_dmd: train.objective dmd's math (src/student/dmd.hpp) on two small random students,
// written for tests/python/test_dmd_reference.py to recompute with diffusers: a generator and a
// critic (the same config, different random weights, fp32 on the host, no projections), a batch
// of 2 contexts (sample 1 shorter, with non-zero rows past its length), k = 2 simulated Euler
// jumps on the shift-3 schedule (generate), the re-noised sample (renoise), a seeded random
// velocity standing in for the teacher's guided answer, the critic's x0 prediction, the DMD
// gradient and loss, the generator's parameter gradients (through the last jump only), and the
// critic's flow-matching loss and gradients on the same re-noised sample (micro_step); and DMD2's
// GAN term: the critic with a realism classifier after its block 0, its logits on a real stand-in
// and on x0 noised to the same t, the classifier's loss and gradients, and the generator's GAN
// gradient in x0 (gan_heads.safetensors, gan.safetensors, critic_gan_grads.safetensors).
//
// MODE i2v makes both students i2v models (in_dim 4 + 4 mask + 4 image channels) and gives the
// batch an image condition y (i2v_condition of a random first-frame latent), which every forward
// takes; MODE ti2v makes them ti2v models and gives the batch TI2V-5B's image mode: x_t whose first
// latent frame is a random image and per-token t with that frame's tokens at 0, which every jump,
// re-noising and fake sample keeps (student::CleanFrames), the DMD gradient and the critic's loss
// leaving that frame out.
//
// OUT_DIR holds generator.safetensors and critic.safetensors (the initial trainable tensors
// under their native names), dmd.safetensors (the batch and every input and result below),
// generator_grads.safetensors, critic_grads.safetensors and reference.json (the model config,
// the DmdSpec, the trainable names, the losses).
// Usage: dump_dmd OUT_DIR [t2v|i2v|ti2v]
#include <torch/torch.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "../unit/student_batches.hpp"
#include "core/errors.hpp"
#include "core/threads.hpp"
#include "data/flow_sampler.hpp"
#include "data/splitmix64.hpp"
#include "model/image_condition.hpp"
#include "model/safetensors.hpp"
#include "student/dmd.hpp"

namespace {

namespace fs = std::filesystem;
using namespace wd;

// Copies of dmd.cpp's private seed domains (kSampleSalt: generate's noise; kDmdSalt: the
// generator request's re-noising). If dmd.cpp changes them, the check of noise0 below fails.
constexpr std::uint64_t kSampleSalt = 0xD3D0'5A3EULL;
constexpr std::uint64_t kDmdSalt = 0xD3D0'0D3DULL;

constexpr std::int64_t kB = 2;
constexpr std::int64_t kCycle = 1;             // the generator update's cycle
constexpr std::int64_t kKey = 2 * kCycle + 1;  // dmd.cpp's generator_key(cycle)
constexpr std::uint64_t kGeneratorSeed = 11, kCriticSeed = 12, kBatchSeed = 13, kRealSeed = 14, kRealXSeed = 15;
constexpr std::uint64_t kImageSeed = 16;
constexpr std::int64_t kFrames = 2, kSide = 8;  // the latent: C x 2 x 8 x 8
constexpr std::uint64_t kGanNoiseSalt = 0x5EED'6A40ULL;  // any salt: the noise is dumped
constexpr std::int64_t kGanBlock = 0;  // not the last block: the classifier reads the middle of the critic

/// The tensors of `names` that have a gradient (the classifier's loss reaches no block after
/// kGanBlock and not the DiT's head).
TensorMap defined_grads(const std::vector<std::string>& names, const std::vector<torch::Tensor>& tensors) {
  TensorMap out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (tensors[i].grad().defined()) out[names[i]] = tensors[i].grad().detach().clone();
  }
  return out;
}

/// DMD2's GAN term on the critic's weights with a realism classifier after block kGanBlock: the
/// classifier's logits on real (a seeded stand-in x_t) and fake (x0 noised to the same t) samples,
/// its loss and the critic's gradients, and the generator's GAN gradient in x0.
nlohmann::ordered_json dump_gan(const fs::path& out, const WanConfig& cfg, student::PartsSetup setup,
                                const comm::TensorDict& batch, const student::DmdSpec& spec, const torch::Tensor& x0,
                                const torch::Tensor& t, const CheckpointPolicy& policy,
                                const student::CleanFrames& clean) {
  setup.seed = kCriticSeed;
  setup.gan = true;
  setup.gan_block = kGanBlock;
  student::StudentParts critic(WanDiT(cfg, WanInit::kRandom, torch::kFloat, kCriticSeed), setup);
  TensorMap heads;
  for (std::size_t i = 0; i < critic.trainable().size(); ++i) {
    const auto& name = critic.trainable_names()[i];
    if (name.rfind("distill_heads.", 0) == 0) heads[name] = critic.trainable()[i].detach().clone();
  }
  WD_CHECK(heads.size() == 4, "the realism classifier has " << heads.size() << " tensors, not 4");
  write_safetensors((out / "gan_heads.safetensors").string(), heads, {{"format", "pt"}});

  const auto real = torch::randn(x0.sizes(), at::detail::createCPUGenerator(kRealXSeed));
  const auto noise = student::seeded_noise(x0, spec, kKey, kGanNoiseSalt);
  const auto fake = clean.keep(student::noised_to(x0, sample_timesteps(t), noise));
  const auto& context = batch.at("context");
  const auto& lens = batch.at("context_lens");
  critic.zero_grad();
  comm::TensorDict both{{"x_t", torch::cat({real, fake})},
                        {"t", torch::cat({t, t})},
                        {"context", torch::cat({context, context})},
                        {"context_lens", torch::cat({lens, lens})}};
  if (batch.count("y")) both["y"] = torch::cat({batch.at("y"), batch.at("y")});
  const auto logits = critic.realism(both, policy);
  const auto loss = student::classifier_loss(logits.narrow(0, 0, kB), logits.narrow(0, kB, kB));
  critic.backward(loss);
  write_safetensors((out / "critic_gan_grads.safetensors").string(),
                    defined_grads(critic.trainable_names(), critic.trainable()), {{"format", "pt"}});
  critic.zero_grad();
  const auto grad = student::gan_gradient(critic, x0, t, noise, batch, policy, clean);
  for (const auto& p : critic.trainable()) {
    WD_CHECK(!p.grad().defined() || p.grad().abs().max().item<double>() == 0,
             "gan_gradient() gave the critic's parameters a gradient");
  }
  write_safetensors((out / "gan.safetensors").string(),
                    {{"real", real}, {"noise", noise}, {"fake", fake}, {"t", t}, {"logits", logits.detach()},
                     {"loss", loss.detach().reshape({1})}, {"grad", grad}},
                    {{"producer", "dump_dmd"}});
  return {{"block", kGanBlock}, {"critic_trainable", critic.trainable_names()}, {"loss", loss.item<double>()}};
}

TensorMap named(const std::vector<std::string>& names, const std::vector<torch::Tensor>& tensors, bool grads) {
  TensorMap out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& t = grads ? tensors[i].grad() : tensors[i];
    WD_CHECK(t.defined(), names[i] << " has no gradient");
    out[names[i]] = t.detach().clone();
  }
  return out;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.detach().to(torch::kDouble) - b.detach().to(torch::kDouble)).abs().max().item<double>();
}

/// The students' config for `mode`: t2v (4 channels in and out), i2v (in_dim 4 + 4 + 4: the
/// noisy latents, the mask, the image latents) or ti2v.
WanConfig config_for(const std::string& mode) {
  auto cfg = student::testing::small_student(mode == "i2v" ? 12 : 4, 4, 32);
  cfg.model_type = mode;
  return cfg;
}

/// The batch: sample 0 has its full context, sample 1 three rows and random rows after them; i2v
/// adds y, ti2v x_t whose first latent frame is the image and t with that frame's tokens at 0.
comm::TensorDict make_batch(const WanConfig& cfg, const std::string& mode) {
  auto gen = at::detail::createCPUGenerator(kBatchSeed);
  comm::TensorDict batch{{"context", torch::randn({kB, cfg.text_len, cfg.text_dim}, gen)},
                         {"context_lens", torch::tensor({cfg.text_len, std::int64_t{3}}, torch::kLong)}};
  auto image_gen = at::detail::createCPUGenerator(kImageSeed);
  if (mode == "i2v") {
    auto image = torch::zeros({kB, cfg.out_dim, kFrames, kSide, kSide});
    image.narrow(2, 0, 1).copy_(torch::randn({kB, cfg.out_dim, 1, kSide, kSide}, image_gen));
    batch["y"] = i2v_condition(image);
  } else if (mode == "ti2v") {
    // As the stream sends it: the noised data with the image as its first frame, per-token t.
    const auto x_t = torch::randn({kB, cfg.out_dim, kFrames, kSide, kSide}, image_gen);
    const auto& p = cfg.patch_size;
    const auto tokens = (kFrames / p[0]) * (kSide / p[1]) * (kSide / p[2]);
    const auto in = condition_input(ImageCondition::kTi2v, torch::randn({kB, cfg.out_dim, 1, kSide, kSide}, image_gen),
                                    x_t, torch::full({kB, tokens}, 900.0f), p);
    batch["x_t"] = in.x_t;
    batch["t"] = in.t;
  }
  return batch;
}

/// The model's inputs at (x, t) with the batch's contexts and y.
comm::TensorDict inputs_at(const torch::Tensor& x, const torch::Tensor& t, const comm::TensorDict& batch) {
  comm::TensorDict in{{"x_t", x}, {"t", t}, {"context", batch.at("context")}, {"context_lens", batch.at("context_lens")}};
  if (batch.count("y")) in["y"] = batch.at("y");
  return in;
}

/// generate()'s sample by hand: k Euler jumps from `noise0`, a ti2v image put back as the first
/// frame at the start and after every jump, its tokens at t = 0.
torch::Tensor jumps_by_hand(student::StudentParts& generator, const comm::TensorDict& batch,
                            const student::DmdSpec& spec, const torch::Tensor& noise0) {
  const bool ti2v = batch.count("t") > 0;
  const auto image = ti2v ? batch.at("x_t").narrow(2, 0, 1) : torch::Tensor();
  const auto put_back = [&](torch::Tensor x) {
    if (ti2v) x.narrow(2, 0, 1).copy_(image);
    return x;
  };
  auto x = put_back(noise0.clone());
  for (std::size_t i = 0; i + 1 < spec.sigmas.size(); ++i) {
    auto t = torch::full({kB}, 1000.0 * spec.sigmas[i], torch::kFloat);
    if (ti2v) t = batch.at("t").ne(0).to(torch::kFloat) * t.view({kB, 1});
    x = put_back(x + (spec.sigmas[i + 1] - spec.sigmas[i]) * generator.predict(inputs_at(x, t, batch)));
  }
  return x;
}

void dump(const fs::path& out, const std::string& mode) {
  set_intra_op_threads(1);
  const auto cfg = config_for(mode);
  student::PartsSetup setup;
  setup.teacher_in_channels = cfg.in_dim;  // the student's own channels: no projections
  setup.teacher_out_channels = cfg.out_dim;
  setup.teacher_dim = cfg.dim;
  setup.seed = kGeneratorSeed;
  student::StudentParts generator(WanDiT(cfg, WanInit::kRandom, torch::kFloat, kGeneratorSeed), setup);
  setup.seed = kCriticSeed;
  student::StudentParts critic(WanDiT(cfg, WanInit::kRandom, torch::kFloat, kCriticSeed), setup);
  write_safetensors((out / "generator.safetensors").string(),
                    named(generator.trainable_names(), generator.trainable(), false), {{"format", "pt"}});
  write_safetensors((out / "critic.safetensors").string(), named(critic.trainable_names(), critic.trainable(), false),
                    {{"format", "pt"}});

  const auto batch = make_batch(cfg, mode);
  const student::CleanFrames clean(generator, batch);
  student::DmdSpec spec;
  spec.sigmas = data::sampling_sigmas(2, 3.0);
  spec.simulate = true;
  spec.shift = 3.0;
  spec.seed = 7;
  spec.student = 0;
  spec.latent = {cfg.out_dim, kFrames, kSide, kSide};
  const auto policy = CheckpointPolicy::parse("off");

  // The generator's sample, and the same k Euler jumps from generate's own noise by hand.
  const auto x0 = student::generate(generator, batch, spec, kKey, /*grad=*/false, policy);
  const auto [c, f, h, w] = spec.latent;
  const auto noise0 = torch::randn(
      {kB, c, f, h, w}, at::detail::createCPUGenerator(data::hash_keys(spec.seed, kSampleSalt, kKey, spec.student)));
  const auto x = jumps_by_hand(generator, batch, spec, noise0);
  WD_CHECK(torch::equal(x, x0), "generate() is not k Euler jumps from noise0: max |diff| " << max_abs_diff(x, x0)
                                                                                         << " (dmd.cpp's salts?)");

  const auto r = student::renoise(x0, spec, kCycle, kDmdSalt, clean);
  const auto at_x = inputs_at(r.x, r.t, batch);
  const auto real_velocity = torch::randn(x0.sizes(), at::detail::createCPUGenerator(kRealSeed));
  const auto real_x0 = r.x - r.sigma * real_velocity;
  const auto fake_x0 = r.x - r.sigma * critic.predict(at_x);
  const auto grad = student::dmd_gradient(x0, real_x0, fake_x0, generator.frame_weights(at_x));

  // The generator update: x0 again, with the last jump's graph.
  generator.zero_grad();
  const auto x0_graph = student::generate(generator, batch, spec, kKey, /*grad=*/true, policy);
  WD_CHECK(x0_graph.requires_grad(), "generate(grad=true) returned no graph");
  const double x0_graph_diff = max_abs_diff(x0_graph, x0);
  const auto loss = student::dmd_loss(x0_graph, grad);
  generator.backward(loss);

  // The critic update: flow matching on the generator's re-noised sample.
  critic.zero_grad();
  auto critic_batch = at_x;
  critic_batch["teacher_out"] = r.noise - x0;
  const auto critic_loss = critic.micro_step(critic_batch, 1.0, policy).read();

  const auto gan = dump_gan(out, cfg, setup, batch, spec, x0, r.t, policy, clean);
  write_safetensors((out / "generator_grads.safetensors").string(),
                    named(generator.trainable_names(), generator.trainable(), true), {{"format", "pt"}});
  write_safetensors((out / "critic_grads.safetensors").string(),
                    named(critic.trainable_names(), critic.trainable(), true), {{"format", "pt"}});
  TensorMap condition;  // i2v: y; ti2v: the batch's x_t (its first frame the image) and t
  for (const char* name : {"y", "x_t", "t"}) {
    if (batch.count(name)) condition[std::string("batch.") + name] = batch.at(name);
  }
  if (!condition.empty()) {
    write_safetensors((out / "condition.safetensors").string(), condition, {{"producer", "dump_dmd"}});
  }
  write_safetensors((out / "dmd.safetensors").string(),
                    {{"context", batch.at("context")},
                     {"context_lens", batch.at("context_lens")},
                     {"sigmas", torch::tensor(spec.sigmas, torch::kDouble)},
                     {"noise0", noise0},
                     {"x0", x0},
                     {"x", r.x},
                     {"t", r.t},
                     {"sigma", r.sigma},
                     {"noise", r.noise},
                     {"real_velocity", real_velocity},
                     {"fake_x0", fake_x0},
                     {"grad", grad},
                     {"loss", loss.detach().reshape({1})}},
                    {{"producer", "dump_dmd"}});
  const nlohmann::ordered_json meta = {
      {"format", "wan-distill-reference-dmd"},
      {"version", 1},
      {"mode", mode},
      {"model", nlohmann::ordered_json::parse(cfg.to_json())},
      {"spec",
       {{"sigmas", spec.sigmas},
        {"steps", spec.sigmas.size() - 1},
        {"shift", spec.shift},
        {"t_min", spec.t_min},
        {"t_max", spec.t_max},
        {"seed", spec.seed},
        {"student", spec.student},
        {"latent", spec.latent},
        {"key", kKey},
        {"cycle", kCycle}}},
      {"generator_trainable", generator.trainable_names()},
      {"critic_trainable", critic.trainable_names()},
      {"generator_loss", loss.item<double>()},
      {"critic_loss", critic_loss.total},
      {"x0_graph_vs_x0", x0_graph_diff},
      {"gan", gan}};
  write_file_atomically((out / "reference.json").string(), meta.dump(2) + "\n");
  std::cout << "wrote " << out.string() << ": generator loss " << loss.item<double>() << ", critic loss "
            << critic_loss.total << ", sigma " << r.sigma.flatten()[0].item<double>() << " "
            << r.sigma.flatten()[1].item<double>() << ", x0 with its graph " << x0_graph_diff << " from x0\n";
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[2] : "t2v";
  if (argc < 2 || argc > 3 || (mode != "t2v" && mode != "i2v" && mode != "ti2v")) {
    std::cerr << "usage: dump_dmd OUT_DIR [t2v|i2v|ti2v]\n";
    return 2;
  }
  try {
    fs::create_directories(argv[1]);
    dump(argv[1], mode);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "dump_dmd: " << e.what() << "\n";
    return 1;
  }
}
