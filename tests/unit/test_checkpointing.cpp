// Gradient checkpointing of the student DiT: gradients and losses equal those of the plain
// forward, for leaf and non-leaf inputs, frozen blocks and a no-grad teacher; policy parsing.
#include <gtest/gtest.h>

#include <map>

#include "core/errors.hpp"
#include "core/torch_compat.hpp"
#include "student/checkpointing.hpp"
#include "student/student_config.hpp"

namespace wd::student::test_checkpointing {
namespace {

constexpr double kTol = 1e-6;  // the bound for fp32

WanConfig small_config(std::int64_t layers = 4) {
  auto c = WanConfig::preset("tiny");
  c.dim = 64;
  c.ffn_dim = 128;
  c.num_heads = 4;
  c.num_layers = layers;
  c.freq_dim = 32;
  c.text_dim = 32;
  c.text_len = 8;
  return c;
}

/// Two samples of different sizes (16 and 8 tokens), so padding and the key mask take part.
WanInputs make_inputs(const WanConfig& c, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  WanInputs in;
  in.x = {torch::randn({c.in_dim, 4, 4, 4}, gen), torch::randn({c.in_dim, 2, 4, 4}, gen)};
  in.t = torch::tensor({250.f, 700.f});
  in.context = {torch::randn({c.text_len, c.text_dim}, gen), torch::randn({5, c.text_dim}, gen)};
  return in;
}

std::vector<torch::Tensor> target_like(const std::vector<torch::Tensor>& out, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<torch::Tensor> t;
  for (const auto& o : out) t.push_back(torch::randn(o.sizes(), gen));
  return t;
}

torch::Tensor loss_of(const std::vector<torch::Tensor>& out, const std::vector<torch::Tensor>& target) {
  auto loss = torch::zeros({});
  for (std::size_t b = 0; b < out.size(); ++b) loss = loss + torch::mse_loss(out[b], target[b]);
  return loss;
}

/// The loss and every parameter's gradient (undefined ones kept as undefined) after one backward.
struct Result {
  double loss = 0;
  std::map<std::string, torch::Tensor> grads;
};

Result step(WanDiT& model, const WanInputs& in, const std::vector<torch::Tensor>& target,
            const CheckpointPolicy& policy) {
  model->zero_grad();
  auto loss = loss_of(student_forward(model, in, policy), target);
  loss.backward();
  Result r;
  r.loss = loss.item<double>();
  for (const auto& p : model->named_parameters()) {
    r.grads[p.key()] = p.value().grad().defined() ? p.value().grad().clone() : torch::Tensor();
  }
  return r;
}

/// Copies every parameter of `from` into `to` (same config).
void sync_parameters(WanDiT& to, WanDiT& from) {
  torch::NoGradGuard no_grad;
  const auto src = from->named_parameters();
  for (auto& p : to->named_parameters()) p.value().copy_(src[p.key()]);
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return (a - b).abs().max().item<double>();
}

/// Same loss bit for bit, same set of defined gradients, each within kTol; prints the margin.
void expect_same(const Result& got, const Result& want, const std::string& what) {
  EXPECT_EQ(got.loss, want.loss) << what;
  ASSERT_EQ(got.grads.size(), want.grads.size());
  double worst = 0;
  for (const auto& [name, g] : want.grads) {
    const auto& h = got.grads.at(name);
    ASSERT_EQ(h.defined(), g.defined()) << what << ": " << name;
    if (!g.defined()) continue;
    const double d = max_abs_diff(h, g);
    worst = std::max(worst, d);
    EXPECT_LE(d, kTol) << what << ": " << name;
  }
  std::printf("  %-34s max|grad diff| = %.3g over %zu parameters (tolerance %.0e)\n", what.c_str(),
              worst, want.grads.size(), kTol);
}

TEST(CheckpointPolicy, ParsesOffAllAndEveryK) {
  EXPECT_EQ(CheckpointPolicy::parse("off").mode, CheckpointPolicy::Mode::kOff);
  EXPECT_FALSE(CheckpointPolicy::parse("off").applies(0));
  const auto all = CheckpointPolicy::parse("all");
  for (std::int64_t i = 0; i < 5; ++i) EXPECT_TRUE(all.applies(i));
  const auto every3 = CheckpointPolicy::parse("every:3");
  EXPECT_EQ(every3.every, 3);
  std::vector<bool> applied;
  for (std::int64_t i = 0; i < 7; ++i) applied.push_back(every3.applies(i));
  EXPECT_EQ(applied, (std::vector<bool>{true, false, false, true, false, false, true}));
  for (const char* text : {"off", "all", "every:1", "every:12"}) {
    EXPECT_EQ(CheckpointPolicy::parse(text).str(), text);
  }
}

TEST(CheckpointPolicy, RejectsEverythingElseNamingTheOption) {
  for (const std::string text : {"", "on", "ALL", "every", "every:", "every:0", "every:-2",
                                 "every:+2", "every: 2", "every:2x", "every:1.5"}) {
    try {
      CheckpointPolicy::parse(text);
      ADD_FAILURE() << "accepted '" << text << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("student.checkpointing(" + text + ")"), std::string::npos)
          << e.what();
    }
  }
  // Bound into the options table, the key is parsed with the options: a bad value stops the parse.
  StudentConfig s;
  OptionTable table("student");
  s.bind(table);
  try {
    parse_options({"--student.checkpointing", "every:0"}, table);
    ADD_FAILURE() << "accepted every:0";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("student.checkpointing(every:0)"), std::string::npos) << e.what();
  }
  parse_options({"--student.checkpointing", "every:3"}, table);
  EXPECT_EQ(s.checkpointing.mode, CheckpointPolicy::Mode::kEvery);
  EXPECT_EQ(s.checkpointing.every, 3);
}

TEST(Checkpointing, TheBlockBecomesOneNodeAndMatchesRunBlock) {
  const auto c = small_config(1);
  WanDiT model(c, WanInit::kRandom, torch::kFloat, 3);
  const auto in = make_inputs(c, 1);
  auto plain = model->embed(in);
  auto ckpt = model->embed(in);
  model->run_block(0, plain);
  run_block_checkpointed(model, 0, ckpt);
  EXPECT_TRUE(torch::equal(plain.x, ckpt.x));
  ASSERT_TRUE(ckpt.x.grad_fn());
  EXPECT_NE(ckpt.x.grad_fn()->name().find("CheckpointedBlock"), std::string::npos)
      << ckpt.x.grad_fn()->name();
  // Inputs x, e0, context plus every parameter of the block.
  EXPECT_EQ(ckpt.x.grad_fn()->num_inputs(), 1u);
  EXPECT_EQ(ckpt.x.grad_fn()->next_edges().size(), 3 + model->block_parameters(0).size());
  EXPECT_EQ(model->block_parameters(0).size(), 27u);  // the spec's 27 tensors per block
}

TEST(Checkpointing, GradientsEqualThoseWithoutForAllAndEvery2) {
  const auto c = small_config(4);
  WanDiT model(c, WanInit::kRandom, torch::kFloat, 11);
  const auto in = make_inputs(c, 2);
  std::vector<torch::Tensor> target;
  {
    torch::NoGradGuard no_grad;
    target = target_like(model->forward(in), 5);
  }
  const auto plain = step(model, in, target, CheckpointPolicy::parse("off"));
  for (const char* p : {"all", "every:2", "every:3"}) {
    expect_same(step(model, in, target, CheckpointPolicy::parse(p)), plain, std::string("policy ") + p);
  }
}

TEST(Checkpointing, NonLeafInputsGetTheirGradientsToo) {
  const auto c = small_config(3);
  WanDiT model(c, WanInit::kRandom, torch::kFloat, 12);
  const auto base = make_inputs(c, 3);
  // Leaves that feed the student through its own ops: x and context arrive as non-leaf tensors.
  auto x_leaf = torch::stack({base.x[0].slice(1, 0, 2), base.x[1]}).requires_grad_(true);
  auto ctx_leaf = base.context[0].clone().requires_grad_(true);
  auto scale = torch::tensor(1.5f).requires_grad_(true);
  std::vector<torch::Tensor> target;
  {
    torch::NoGradGuard no_grad;
    target = target_like(model->forward(base), 6);
    target[0] = target[0].slice(1, 0, 2);
  }
  struct Out {
    Result r;
    torch::Tensor gx, gc, gs;
  };
  const auto run = [&](const char* policy) {
    x_leaf.mutable_grad() = torch::Tensor();
    ctx_leaf.mutable_grad() = torch::Tensor();
    scale.mutable_grad() = torch::Tensor();
    auto x = x_leaf * scale + 0.1;  // non-leaf, requires grad
    auto ctx = torch::tanh(ctx_leaf);
    auto in = WanInputs::batched(x, base.t, torch::stack({ctx, ctx * 0.5}), torch::tensor({8, 5}));
    EXPECT_FALSE(in.x[0].is_leaf());
    Out o{step(model, in, target, CheckpointPolicy::parse(policy)), x_leaf.grad().clone(),
          ctx_leaf.grad().clone(), scale.grad().clone()};
    return o;
  };
  const auto plain = run("off");
  ASSERT_GT(plain.gx.abs().sum().item<double>(), 0.0);
  ASSERT_GT(plain.gc.abs().sum().item<double>(), 0.0);
  for (const char* p : {"all", "every:2"}) {
    const auto got = run(p);
    expect_same(got.r, plain.r, std::string("non-leaf inputs, ") + p);
    EXPECT_LE(max_abs_diff(got.gx, plain.gx), kTol) << p;
    EXPECT_LE(max_abs_diff(got.gc, plain.gc), kTol) << p;
    EXPECT_LE(max_abs_diff(got.gs, plain.gs), kTol) << p;
  }
}

TEST(Checkpointing, FrozenTeacherTargetAndFrozenStudentBlocks) {
  auto tc = small_config(2);
  tc.dim = 96;
  tc.num_heads = 4;
  tc.ffn_dim = 192;
  WanDiT teacher(tc, WanInit::kRandom, torch::kFloat, 21);
  for (auto& p : teacher->parameters()) p.requires_grad_(false);
  const auto c = small_config(4);
  WanDiT student(c, WanInit::kRandom, torch::kFloat, 22);
  // A frozen block in the middle: its node still passes gradients to the blocks before it.
  for (auto& p : student->block_parameters(1)) p.requires_grad_(false);
  const auto in = make_inputs(c, 4);

  std::vector<torch::Tensor> target;
  {
    // The teacher side runs under no-grad: a checkpointing policy there changes nothing.
    torch::NoGradGuard no_grad;
    target = student_forward(teacher, in, CheckpointPolicy::parse("all"));
    const auto plain_target = teacher->forward(in);
    for (std::size_t b = 0; b < target.size(); ++b) {
      EXPECT_FALSE(target[b].requires_grad());
      EXPECT_TRUE(torch::equal(target[b], plain_target[b]));
    }
  }
  const auto plain = step(student, in, target, CheckpointPolicy::parse("off"));
  for (const auto& p : student->block_parameters(1)) EXPECT_FALSE(p.grad().defined());
  for (const char* p : {"all", "every:2"}) {
    expect_same(step(student, in, target, CheckpointPolicy::parse(p)), plain,
                std::string("teacher target, frozen block, ") + p);
  }
  for (const auto& p : teacher->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(Checkpointing, PolicyCanChangeBetweenSteps) {
  const auto c = small_config(4);
  WanDiT switching(c, WanInit::kRandom, torch::kFloat, 31);
  WanDiT reference(c, WanInit::kRandom, torch::kFloat, 31);
  torch::optim::SGD opt_s(switching->parameters(), torch::optim::SGDOptions(0.05));
  const auto in = make_inputs(c, 5);
  std::vector<torch::Tensor> target;
  {
    torch::NoGradGuard no_grad;
    target = target_like(reference->forward(in), 7);
  }
  const auto off = CheckpointPolicy::parse("off");
  for (const char* p : {"all", "off", "every:2", "all"}) {
    // The reference starts each step from the switching model's weights: a checkpointed backward
    // sums the gradients of parameters every block shares (the time projection) in another
    // order (~5e-8 apart), so two models stepped apart would differ by that rounding after one
    // update, and only equal weights make the next loss comparable bit for bit.
    sync_parameters(reference, switching);
    const auto got = step(switching, in, target, CheckpointPolicy::parse(p));
    const auto want = step(reference, in, target, off);
    expect_same(got, want, std::string("step with ") + p);
    opt_s.step();
  }
  sync_parameters(reference, switching);
  // Evaluation between steps runs under no-grad: the policy is ignored there.
  torch::NoGradGuard no_grad;
  const auto a = student_forward(switching, in, CheckpointPolicy::parse("all"));
  const auto b = reference->forward(in);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_LE(max_abs_diff(a[i], b[i]), kTol);
}

TEST(Checkpointing, BackwardAfterAnInPlaceParameterChangeIsRefused) {
  const auto c = small_config(2);
  WanDiT model(c, WanInit::kRandom, torch::kFloat, 41);
  const auto in = make_inputs(c, 6);
  auto out = student_forward(model, in, CheckpointPolicy::parse("all"));
  {
    torch::NoGradGuard no_grad;
    model->block_parameters(1)[0].add_(1.0);  // an optimizer step before the backward
  }
  // The recomputation would use the new weights; autograd's version check catches it.
  try {
    loss_of(out, target_like(out, 1)).backward();
    ADD_FAILURE() << "backward ran on changed weights";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("modified by an inplace operation"), std::string::npos)
        << e.what();
  }
}

TEST(Checkpointing, BackwardLeavesTheCallersRandomStreamAlone) {
  const auto c = small_config(2);
  WanDiT model(c, WanInit::kRandom, torch::kFloat, 51);
  const auto in = make_inputs(c, 7);
  const auto draw_after = [&](const char* policy) {
    torch::manual_seed(123);
    auto out = student_forward(model, in, CheckpointPolicy::parse(policy));
    loss_of(out, target_like(out, 2)).backward();
    return torch::randn({8});
  };
  EXPECT_TRUE(torch::equal(draw_after("all"), draw_after("off")));
  // And a snapshot restored replays the same draws.
  const auto snap = compat::rng_snapshot(torch::kCPU);
  const auto first = torch::rand({4});
  compat::rng_restore(snap);
  EXPECT_TRUE(torch::equal(torch::rand({4}), first));
}

}  // namespace
}  // namespace wd::student::test_checkpointing
