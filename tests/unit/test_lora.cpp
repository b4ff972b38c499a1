// LoRA adapters on the DiT (model/wan_dit, model/wan_lora): the adapted forward equals the merged
// model's, only adapters get gradients and checkpointed blocks give the same ones, the target
// list's words, LoRA folders round-trip and open merged, and LoRA files of every layout import
// with their scale (or are refused naming the file and key); a LoRA pair routes each sample to
// its expert and trains only that expert's adapters on it, and converts to one pipeline of both.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/errors.hpp"
#include "model/safetensors.hpp"
#include "model/wan_checkpoint.hpp"
#include "model/diffusers_pipeline.hpp"
#include "model/wan_convert.hpp"
#include "model/wan_experts.hpp"
#include "model/wan_lora.hpp"
#include "student/checkpointing.hpp"
#include "student/student_parts.hpp"
#include "test_util.hpp"

namespace wd::test_lora {
namespace {

namespace fs = std::filesystem;

/// `run` throws an E whose message contains `part`.
template <typename E, typename F>
void expect_throw_contains(F run, const std::string& part) {
  try {
    run();
    ADD_FAILURE() << "nothing thrown; expected: " << part;
  } catch (const E& e) {
    EXPECT_TRUE(test::contains(e.what(), part)) << e.what() << "\n  expected: " << part;
  }
}

WanConfig small_config() {
  auto c = WanConfig::preset("tiny");
  c.dim = 64;
  c.ffn_dim = 96;
  c.num_heads = 4;
  c.num_layers = 2;
  c.freq_dim = 32;
  c.text_dim = 32;
  c.text_len = 8;
  return c;
}

WanInputs make_inputs(const WanConfig& c, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  WanInputs in;
  in.x = {torch::randn({c.in_dim, 2, 4, 4}, gen), torch::randn({c.in_dim, 1, 4, 4}, gen)};
  in.t = torch::tensor({250.f, 700.f});
  in.context = {torch::randn({c.text_len, c.text_dim}, gen), torch::randn({5, c.text_dim}, gen)};
  return in;
}

/// A random DiT with frozen weights and rank-4 adapters (alpha 8: scale 2) on `targets`, their up
/// matrices random too (trained adapters are not zero).
WanDiT adapted(const WanConfig& c, const std::string& targets = "attn,ffn", std::uint64_t base_seed = 3) {
  WanDiT m(c, WanInit::kRandom, torch::kFloat, base_seed);
  for (auto& p : m->parameters()) p.set_requires_grad(false);
  m->add_lora(LoraSpec{4, 8.0, lora_target_linears(targets, c.num_layers)}, 11);
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(5);
  for (auto& [name, t] : m->lora_parameters()) {
    if (name.find("lora_up") != std::string::npos) t.copy_(0.05 * torch::randn(t.sizes(), gen));
  }
  return m;
}

/// The same DiT with W + scale · up · down in place of every adapted weight, no adapters.
WanDiT merged(const WanDiT& a) {
  WanDiT m(a->config(), WanInit::kRandom, torch::kFloat, 3);
  torch::NoGradGuard no_grad;
  auto params = m->named_parameters();
  for (const auto& linear : a->lora().targets) {
    const auto down = a->named_parameters()[linear + ".lora_down"];
    const auto up = a->named_parameters()[linear + ".lora_up"];
    params[linear + ".weight"].add_(a->lora().scale() * torch::mm(up, down));
  }
  return m;
}

TEST(Lora, AdaptersStartAsTheBaseAndForwardAsTheMergedModel) {
  const auto c = small_config();
  WanDiT plain(c, WanInit::kRandom, torch::kFloat, 3);
  WanDiT fresh(c, WanInit::kRandom, torch::kFloat, 3);
  fresh->add_lora(LoraSpec{4, 8.0, lora_target_linears("all", c.num_layers)}, 11);
  EXPECT_EQ(fresh->lora_parameters().size(), 2u * 10 * 2);  // down + up, 10 linears, 2 blocks
  const auto in = make_inputs(c, 1);
  torch::NoGradGuard no_grad;
  // up = 0 at the start: exactly the base.
  const auto a = fresh->forward(in), b = plain->forward(in);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i]));
  auto lora = adapted(c);
  auto m = merged(lora);
  const auto x = lora->forward(in), y = m->forward(in);
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_LT((x[i] - y[i]).abs().max().item<double>(), 1e-5);
    EXPECT_GT((x[i] - b[i]).abs().max().item<double>(), 1e-2);  // the adapters do something
  }
}

TEST(Lora, OnlyAdaptersLearnAndCheckpointedBlocksGiveTheSameGradients) {
  const auto c = small_config();
  auto model = adapted(c, "q,v,ffn");
  const auto in = make_inputs(c, 2);
  std::map<std::string, torch::Tensor> grads[2];
  int k = 0;
  for (const char* policy : {"off", "all"}) {
    model->zero_grad();
    auto out = student::student_forward(model, in, CheckpointPolicy::parse(policy), nullptr);
    auto loss = torch::zeros({});
    for (const auto& o : out) loss = loss + o.pow(2).mean();
    loss.backward();
    for (const auto& p : model->named_parameters()) {
      if (WanDiTImpl::is_lora_name(p.key())) {
        ASSERT_TRUE(p.value().grad().defined()) << p.key();
        grads[k][p.key()] = p.value().grad().clone();
      } else {
        EXPECT_FALSE(p.value().grad().defined()) << p.key() << " is frozen";
      }
    }
    ++k;
  }
  // q, v of both attentions + ffn.0, ffn.2: 6 linears a block, 2 blocks, down and up.
  ASSERT_EQ(grads[0].size(), 24u);
  for (const auto& [name, g] : grads[0]) {
    EXPECT_LT((g - grads[1][name]).abs().max().item<double>(), 1e-6 * (1 + g.abs().max().item<double>())) << name;
  }
}

TEST(Lora, TargetWordsExpandOverBlocksAndUnknownOnesAreRefused) {
  EXPECT_EQ(lora_target_linears("ffn", 2), (std::vector<std::string>{"blocks.0.ffn.0", "blocks.0.ffn.2",
                                                                      "blocks.1.ffn.0", "blocks.1.ffn.2"}));
  EXPECT_EQ(lora_target_linears("o, self_attn.q", 1),
            (std::vector<std::string>{"blocks.0.self_attn.q", "blocks.0.self_attn.o", "blocks.0.cross_attn.o"}));
  EXPECT_EQ(lora_target_linears("attn,ffn", 3).size(), 30u);
  EXPECT_EQ(lora_target_linears("all", 3), lora_target_linears("attn,ffn", 3));
  expect_throw_contains<ConfigError>([] { lora_target_linears("attn,mlp", 2); },
                                           "student.lora_targets(attn,mlp): unknown target 'mlp'");
  expect_throw_contains<ConfigError>([] { lora_target_linears(" , ", 2); }, "student.lora_targets is empty");
}

// A LoRA pair (two experts' adapters, StudentParts::pair): each sample of a mixed batch goes to
// the expert its t picks, and gives gradients to that expert's adapters alone; trainable names
// carry the expert's folder; the pair saves as the two folders a LoRA pair is read from.
TEST(Lora, APairSendsEachSampleToItsExpertAndTrainsOnlyThatExpertsAdapters) {
  const auto c = small_config();
  auto high = adapted(c, "attn,ffn", 3), low = adapted(c, "attn,ffn", 4);  // two different bases
  test::TempDir tmp("lora-pair");
  student::PartsSetup setup;
  setup.teacher_in_channels = c.in_dim;
  setup.teacher_out_channels = c.out_dim;
  setup.teacher_dim = c.dim;
  setup.lora_base = (tmp.path() / "teacher" / "high_noise_model").string();
  setup.lora_base_low = (tmp.path() / "teacher" / "low_noise_model").string();
  // WanExperts::route's rule at boundary 0.875: {low, high}, high when trunc(t) >= 875.
  setup.router = [](const torch::Tensor& t) {
    std::vector<std::vector<std::int64_t>> routes(2);
    for (std::int64_t b = 0; b < t.size(0); ++b) routes[std::trunc(t[b].item<double>()) >= 875 ? 1 : 0].push_back(b);
    return routes;
  };
  auto parts = student::StudentParts::pair(high, low, setup);
  EXPECT_TRUE(parts.is_pair());
  const auto per_model = high->lora_parameters().size();
  ASSERT_EQ(parts.trainable().size(), 2 * per_model);
  EXPECT_EQ(parts.trainable_names().front().rfind("high_noise_model.blocks.", 0), 0u) << parts.trainable_names().front();
  EXPECT_EQ(parts.trainable_names().back().rfind("low_noise_model.blocks.", 0), 0u) << parts.trainable_names().back();

  auto gen = at::detail::createCPUGenerator(7);
  comm::TensorDict batch{{"x_t", torch::randn({3, c.in_dim, 1, 4, 4}, gen)},
                         {"t", torch::tensor({900.f, 874.9f, 875.f})},
                         {"context", torch::randn({3, c.text_len, c.text_dim}, gen)},
                         {"context_lens", torch::tensor({8, 5, 3}, torch::kLong)}};
  const auto out = parts.predict(batch);
  ASSERT_EQ(out.size(0), 3);
  const std::array<WanDiT*, 3> expert_of{&high, &low, &high};  // 874.9 truncates to 874: low
  for (std::int64_t b = 0; b < 3; ++b) {
    torch::NoGradGuard no_grad;
    const auto one = WanInputs::batched(batch["x_t"].narrow(0, b, 1), batch["t"].narrow(0, b, 1),
                                        batch["context"].narrow(0, b, 1), batch["context_lens"].narrow(0, b, 1));
    const auto want = (*expert_of[b])->forward(one).front();
    EXPECT_LT((out[b] - want).abs().max().item<double>(), 1e-5) << "sample " << b;
    const auto other = (expert_of[b] == &high ? low : high)->forward(one).front();
    EXPECT_GT((out[b] - other).abs().max().item<double>(), 1e-2) << "sample " << b << " is not the other expert's";
  }

  // A batch of high-noise samples: gradients reach the high expert's adapters, none the low one's.
  comm::TensorDict noisy = batch;
  noisy["t"] = torch::tensor({990.f, 900.f, 875.f});
  noisy["teacher_out"] = torch::randn({3, c.out_dim, 1, 4, 4}, gen);
  parts.zero_grad();
  parts.micro_step(noisy, 1.0, CheckpointPolicy::parse("all"));
  for (std::size_t i = 0; i < parts.trainable().size(); ++i) {
    const auto& g = parts.trainable()[i].grad();
    if (i < per_model) {
      EXPECT_TRUE(g.defined() && g.abs().sum().item<double>() > 0) << parts.trainable_names()[i];
    } else {
      EXPECT_FALSE(g.defined()) << parts.trainable_names()[i] << " (the low expert saw no sample)";
    }
  }

  parts.save((tmp.path() / "student").string());
  const auto pair = read_lora_pair((tmp.path() / "student").string());  // {low, high}
  EXPECT_EQ(fs::path(pair[1].base).filename(), "high_noise_model");
  EXPECT_EQ(fs::path(pair[0].base).filename(), "low_noise_model");
  EXPECT_EQ(pair[0].spec.rank, 4);
}

/// A base checkpoint on disk (native layout, fp32) and a LoRA folder over it.
struct OnDisk {
  test::TempDir tmp{"lora"};
  fs::path dir = tmp.path();
  WanConfig config = small_config();
  WanDiT lora = adapted(config);
  OnDisk() {
    write_random_wan_checkpoint((dir / "base").string(), config, torch::kFloat, 1ULL << 30, 3);
    write_lora_folder(*lora, (dir / "student").string(), (dir / "base").string());
  }
};

TEST(Lora, AFolderRoundTripsAndOpensAsTheMergedModel) {
  OnDisk d;
  const auto folder = read_lora_folder((d.dir / "student").string());
  EXPECT_EQ(folder.spec.rank, 4);
  EXPECT_EQ(folder.spec.alpha, 8.0);
  EXPECT_EQ(folder.spec.targets, d.lora->lora().targets);
  const auto ck = WanCheckpoint::open((d.dir / "student").string());
  ASSERT_NE(ck.lora(), nullptr);
  auto m = merged(d.lora);
  const auto want = m->named_parameters();
  for (const auto& p : want) {
    EXPECT_TRUE(torch::allclose(ck.tensor(p.key()), p.value(), 0, 1e-6)) << p.key();
  }
  // A base that is gone: named with the field that points at it.
  fs::rename(d.dir / "base", d.dir / "moved");
  expect_throw_contains<DataError>([&] { WanCheckpoint::open((d.dir / "student").string()); },
                                         "lora.json: base: names a base checkpoint that does not open");
}

TEST(Lora, AFolderOverABf16BaseConvertsToItsFp32MergeNotTheMergeRoundedToBf16) {
  test::TempDir tmp{"lora-bf16"};
  const auto config = small_config();
  const auto lora = adapted(config);
  write_random_wan_checkpoint(tmp.str("base"), config, torch::kBFloat16, 1ULL << 30, 3);
  write_lora_folder(*lora, tmp.str("student"), tmp.str("base"));
  const auto folder = WanCheckpoint::open(tmp.str("student"));
  const auto base = WanCheckpoint::open(tmp.str("base"));
  ConvertOptions fp32;
  fp32.dtype = torch::kFloat;
  convert_wan_checkpoint(folder, tmp.str("fp32"), fp32);
  ConvertOptions bf16;
  convert_wan_checkpoint(folder, tmp.str("bf16"), bf16);
  const auto wide = WanCheckpoint::open(tmp.str("fp32"));
  const auto narrow = WanCheckpoint::open(tmp.str("bf16"));
  auto params = lora->named_parameters();
  auto loaded = load_wan_dit(folder, torch::kFloat)->named_parameters();
  for (const auto& linear : lora->lora().targets) {
    const auto key = linear + ".weight";
    ASSERT_TRUE(folder.merges(key)) << key;
    const auto want = base.tensor(key).to(torch::kFloat) +
                      lora->lora().scale() * torch::mm(params[linear + ".lora_up"], params[linear + ".lora_down"]);
    EXPECT_EQ(wide.tensor(key).scalar_type(), torch::kFloat) << key;
    EXPECT_TRUE(torch::allclose(wide.tensor(key), want, 0, 1e-6)) << key << ": the fp32 output is the fp32 merge";
    EXPECT_FALSE(torch::equal(wide.tensor(key), want.to(torch::kBFloat16).to(torch::kFloat))) << key;
    // A bf16 output rounds the fp32 merge once, as reading the folder in its base's dtype does.
    EXPECT_TRUE(torch::equal(narrow.tensor(key), want.to(torch::kBFloat16))) << key;
    EXPECT_TRUE(torch::equal(narrow.tensor(key), folder.tensor(key))) << key;
    // Read with a dtype asked (forward, sample, teacher.dtype), the fp32 merge goes straight to it.
    EXPECT_TRUE(torch::allclose(folder.tensor(key, torch::kFloat), want, 0, 1e-6)) << key;
    EXPECT_TRUE(torch::equal(folder.tensor(key, torch::kHalf), want.to(torch::kHalf))) << key;
    EXPECT_TRUE(torch::allclose(loaded[key], want, 0, 1e-6)) << key;
  }
  EXPECT_FALSE(folder.merges("blocks.0.modulation"));
  EXPECT_TRUE(torch::equal(wide.tensor("blocks.0.modulation"), base.tensor("blocks.0.modulation").to(torch::kFloat)));
}

// A LoRA pair converts whole (convert_wan_experts): a diffusers pipeline of both experts,
// transformer/ the high-noise one and transformer_2/ the low-noise one, each its bf16 base plus its
// adapters merged in fp32, with its teacher's boundary_ratio; the official layout holds the same
// tensors. A single diffusers DiT folder, an existing output and a pair whose teacher is gone are
// refused, and nothing is written.
TEST(Lora, APairConvertsToOnePipelineOfBothExpertsEachMergedInFp32) {
  test::TempDir tmp{"lora-pair-convert"};
  const auto config = small_config();
  const auto teacher = tmp.path() / "teacher";
  write_random_wan_experts(teacher.string(), config, torch::kBFloat16, 1ULL << 30, 3, KeyLayout::kDiffusers);
  write_diffusers_model_index(teacher.string(), config, true, 0.8);  // the teacher's own, not t2v's 0.875
  const auto high = adapted(config, "attn,ffn", 3), low = adapted(config, "q,v", 4);
  const auto pair = tmp.path() / "pair";
  const std::array<fs::path, 2> bases{teacher / DiffusersPipeline::kTransformer2, teacher / DiffusersPipeline::kTransformer};
  write_lora_folder(*high, (pair / WanExperts::kHighDir).string(), bases[WanExperts::kHigh].string());
  write_lora_folder(*low, (pair / WanExperts::kLowDir).string(), bases[WanExperts::kLow].string());
  const auto experts = WanExperts::open(pair.string());
  EXPECT_EQ(experts.boundary(), 0.8) << experts.boundary_origin();
  ConvertOptions options;
  options.dtype = torch::kFloat;
  options.layout = KeyLayout::kDiffusers;
  options.pipeline = true;
  convert_wan_experts(experts, tmp.str("pipeline"), options);
  const auto index = DiffusersPipeline::read(tmp.str("pipeline"));
  EXPECT_TRUE(index.two_experts);
  EXPECT_EQ(index.boundary_ratio, 0.8);
  EXPECT_EQ(index.class_name, "WanPipeline");
  options.layout = KeyLayout::kNative;
  options.pipeline = false;
  convert_wan_experts(experts, tmp.str("native"), options);
  const auto converted = WanExperts::open(tmp.str("pipeline")), native = WanExperts::open(tmp.str("native"));
  EXPECT_EQ(converted.boundary(), 0.8);
  EXPECT_EQ(converted.expert_name(WanExperts::kHigh), DiffusersPipeline::kTransformer);
  for (const auto i : {WanExperts::kLow, WanExperts::kHigh}) {
    const auto& lora = i == WanExperts::kHigh ? high : low;
    const auto base = WanCheckpoint::open(bases[i].string());
    auto params = lora->named_parameters();
    for (const auto& linear : lora->lora().targets) {
      const auto key = linear + ".weight";
      const auto want = base.tensor(key).to(torch::kFloat) +
                        lora->lora().scale() * torch::mm(params[linear + ".lora_up"], params[linear + ".lora_down"]);
      const auto got = converted.expert(i).tensor(key);
      EXPECT_TRUE(torch::allclose(got, want, 0, 1e-6)) << i << " " << key << ": the fp32 merge";
      EXPECT_FALSE(torch::equal(got, want.to(torch::kBFloat16).to(torch::kFloat))) << i << " " << key;
      EXPECT_TRUE(torch::equal(native.expert(i).tensor(key), got)) << i << " " << key;
    }
  }
  // The low expert's adapters are on q and v: its k is the base's, widened.
  const auto k = "blocks.0.self_attn.k.weight";
  EXPECT_TRUE(torch::equal(converted.expert(WanExperts::kLow).tensor(k),
                           WanCheckpoint::open(bases[WanExperts::kLow].string()).tensor(k).to(torch::kFloat)));
  options.layout = KeyLayout::kDiffusers;
  expect_throw_contains<ConfigError>([&] { convert_wan_experts(experts, tmp.str("diffusers"), options); },
                                     "make no single diffusers WanTransformer3DModel folder");
  options.pipeline = true;
  expect_throw_contains<ConfigError>([&] { convert_wan_experts(experts, tmp.str("pipeline"), options); },
                                     "already exists; pass --force");
  fs::rename(teacher, tmp.path() / "moved");
  expect_throw_contains<DataError>([&] { WanExperts::open(pair.string()); },
                                   "low_noise_model/lora.json: base: names a base checkpoint that does not open");
  EXPECT_FALSE(fs::exists(tmp.path() / "diffusers"));
}

TEST(Lora, FilesOfEveryLayoutImportWithTheirScale) {
  OnDisk d;
  const auto folder = read_lora_folder((d.dir / "student").string());
  const auto exported = d.dir / "exported";
  fs::create_directories(exported);
  write_lora_exports(folder, exported.string(), torch::kFloat);
  // The delta up · down each import yields, against the folder's scale · up · down.
  const auto expect_same_delta = [&](const ImportedLora& got, const std::string& what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(got.rank, 4);
    ASSERT_EQ(got.adapters.size(), folder.adapters.size());
    for (const auto& [linear, pair] : folder.adapters) {
      const auto want = folder.spec.scale() * torch::mm(pair.second, pair.first);
      const auto& g = got.adapters.at(linear);
      EXPECT_TRUE(torch::allclose(torch::mm(g.second, g.first), want, 0, 1e-6)) << linear;
    }
  };
  expect_same_delta(read_lora_file((d.dir / "student").string(), d.config), "LoRA folder");
  expect_same_delta(read_lora_file((exported / kDiffusersLoraFile).string(), d.config), "diffusers");
  expect_same_delta(read_lora_file((exported / kComfyLoraFile).string(), d.config), "ComfyUI");
  // diffusers' peft metadata (r, lora_alpha) is honoured when the file carries no alpha tensors.
  TensorMap raw;
  for (const auto& [linear, pair] : folder.adapters) {
    auto name = native_to_diffusers(linear + ".weight");
    name = "transformer." + name.substr(0, name.size() - 7);
    raw[name + ".lora_A.weight"] = pair.first;
    raw[name + ".lora_B.weight"] = pair.second;
  }
  const auto with_meta = (d.dir / "meta.safetensors").string();
  write_safetensors(with_meta, raw, {{"lora_adapter_metadata", R"({"transformer.r": 4, "transformer.lora_alpha": 8})"}});
  expect_same_delta(read_lora_file(with_meta, d.config), "diffusers with metadata");
  // Loaded into a model of another alpha: the same delta.
  WanDiT target(d.config, WanInit::kRandom, torch::kFloat, 3);
  for (auto& p : target->parameters()) p.set_requires_grad(false);
  target->add_lora(LoraSpec{4, 2.0, d.lora->lora().targets}, 1);
  load_lora_into(*target, read_lora_file(with_meta, d.config), with_meta);
  const auto params = target->named_parameters();
  for (const auto& [linear, pair] : folder.adapters) {
    const auto delta = target->lora().scale() * torch::mm(params[linear + ".lora_up"], params[linear + ".lora_down"]);
    EXPECT_TRUE(torch::allclose(delta, folder.spec.scale() * torch::mm(pair.second, pair.first), 0, 1e-6)) << linear;
  }
}

TEST(Lora, BadFilesAreRefusedNamingTheKey) {
  OnDisk d;
  const auto c = d.config;
  const auto path = (d.dir / "bad.safetensors").string();
  const auto down = torch::zeros({4, c.dim}), up = torch::zeros({c.dim, 4});
  write_safetensors(path, {{"transformer.blocks.0.attn1.to_q.lora_A.weight", down},
                           {"transformer.blocks.0.norm2.lora_A.weight", down}});
  expect_throw_contains<DataError>([&] { read_lora_file(path, c); },
                                         "transformer.blocks.0.norm2.lora_A.weight: is not a LoRA adapter");
  write_safetensors(path, {{"transformer.blocks.0.attn1.to_q.lora_A.weight", down}});
  expect_throw_contains<DataError>([&] { read_lora_file(path, c); }, "no up (B) matrix for blocks.0.self_attn.q");
  write_safetensors(path, {{"diffusion_model.blocks.0.ffn.0.lora_down.weight", down},
                           {"diffusion_model.blocks.0.ffn.0.lora_up.weight", up}});
  expect_throw_contains<DataError>([&] { read_lora_file(path, c); }, "do not fit blocks.0.ffn.0");
  // Rank 4 into a rank-8 student, and a linear the student does not adapt.
  write_safetensors(path, {{"diffusion_model.blocks.0.ffn.2.lora_down.weight", torch::zeros({4, c.ffn_dim})},
                           {"diffusion_model.blocks.0.ffn.2.lora_up.weight", up}});
  WanDiT m(c, WanInit::kRandom, torch::kFloat, 3);
  m->add_lora(LoraSpec{8, 8.0, lora_target_linears("attn", c.num_layers)}, 1);
  expect_throw_contains<ConfigError>([&] { load_lora_into(*m, read_lora_file(path, c), path); },
                                           "holds rank-4 adapters; student.lora_rank is 8");
  WanDiT n(c, WanInit::kRandom, torch::kFloat, 3);
  n->add_lora(LoraSpec{4, 8.0, lora_target_linears("attn", c.num_layers)}, 1);
  expect_throw_contains<ConfigError>([&] { load_lora_into(*n, read_lora_file(path, c), path); },
                                           "adapts blocks.0.ffn.2, which student.lora_targets does not include");
}

}  // namespace
}  // namespace wd::test_lora
