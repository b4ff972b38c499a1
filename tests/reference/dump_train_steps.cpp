// dump_train_steps: the tiny job's student trained for a few steps by the student loop itself
// (run_student), every input and result written for tests/python/test_reference_step.py.
// Usage (one rank): mpirun -n 1 dump_train_steps OUT_DIR
#include <mpi.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "comm/gradient_reducer.hpp"
#include "comm/mpi_runtime.hpp"
#include "comm/stream_plan.hpp"
#include "core/errors.hpp"
#include "core/threads.hpp"
#include "core/torch_compat.hpp"
#include "model/safetensors.hpp"
#include "model/wan_checkpoint.hpp"
#include "student/student_loop.hpp"
#include "student/student_model.hpp"
#include "student/train_state.hpp"

namespace {

namespace fs = std::filesystem;
using namespace wd;

constexpr std::int64_t kSteps = 3;
constexpr std::uint64_t kBatchSeed = 20251203;
constexpr std::uint64_t kTeacherSeed = 20251122;  // the builtin teacher's (train_prepare.cpp)

/// The teacher end of the stream, replaced by seeded random batches of the message's shapes: a
/// fresh batch per step, kept so that the dump can write what the student received. Sample 0
/// has its full context; later samples a shorter one, with non-zero rows past their length
/// (the student must drop them).
class SeededBatches final : public comm::Receiver {
 public:
  explicit SeededBatches(comm::MessageSpec spec) : spec_(std::move(spec)) {}

  const comm::Message& recv(std::int64_t step) override {
    auto gen = at::detail::createCPUGenerator(kBatchSeed + static_cast<std::uint64_t>(step));
    comm::TensorDict batch;
    for (const auto& t : spec_.tensors) {
      if (t.name == "t") {
        batch[t.name] = torch::rand(t.shape, gen) * 1000;
      } else if (t.name == "context_lens") {
        const auto rows = context_rows();
        auto lens = torch::randint(1, rows, t.shape, gen, torch::kLong);
        lens[0].fill_(rows);
        batch[t.name] = lens;
      } else {
        batch[t.name] = torch::randn(t.shape, gen);
      }
    }
    received.push_back(batch);
    message_ = {step, batch};
    return message_;
  }
  void release(std::int64_t) override {}
  double wait_seconds() const override { return 0; }

  std::vector<comm::TensorDict> received;  ///< one batch per transport step

 private:
  std::int64_t context_rows() const {
    for (const auto& t : spec_.tensors) {
      if (t.name == "context") return t.shape[1];
    }
    throw Error("the message has no context");
  }

  comm::MessageSpec spec_;
  comm::Message message_;
};

/// <out>/step<k>/, created: step k's batch, gradients and training state (1-based, as saved).
fs::path step_dir(const fs::path& out, std::int64_t step) {
  const auto dir = out / ("step" + std::to_string(step));
  fs::create_directories(dir);
  return dir;
}

TensorMap named(const std::vector<std::string>& names, const std::vector<torch::Tensor>& tensors) {
  TensorMap out;
  for (std::size_t i = 0; i < names.size(); ++i) out[names[i]] = tensors[i].detach();
  return out;
}

/// The stream of the tiny job's first kSteps steps for one student (no held-out batches).
comm::StreamPlan tiny_plan(const WanConfig& tc, const student::TrainConfig& train) {
  comm::StreamPlan plan;
  plan.batch_per_student = train.batch_size;
  plan.train_steps = kSteps;
  plan.micro_batches = train.grad_accum;
  plan.latent = {tc.in_dim, 3, 16, 16};  // the builtin data set's latents
  plan.out_channels = tc.out_dim;
  plan.context_len = tc.text_len;
  plan.text_dim = tc.text_dim;
  plan.tokens = plan.latent[1] / tc.patch_size[0] * (plan.latent[2] / tc.patch_size[1]) *
                (plan.latent[3] / tc.patch_size[2]);
  plan.teacher_dim = tc.dim;
  return plan;
}

/// reference.json: the student's config, the optimizer and schedule, the trainable tensors in
/// the optimizer's order, and per step the loss and the learning rate used.
nlohmann::ordered_json describe(const WanConfig& sc, const torch::optim::AdamWOptions& options,
                                const student::TrainConfig& train, const std::vector<std::string>& names,
                                const nlohmann::ordered_json& steps) {
  return {{"format", "wan-distill-reference-steps"},
          {"version", 1},
          {"libtorch", compat::torch_version()},
          {"model", nlohmann::ordered_json::parse(sc.to_json())},
          {"optimizer",
           {{"name", "AdamW"},
            {"beta1", std::get<0>(options.betas())},
            {"beta2", std::get<1>(options.betas())},
            {"eps", options.eps()},
            {"weight_decay", options.weight_decay()},
            {"amsgrad", options.amsgrad()},
            {"grad_clip", train.grad_clip}}},
          {"schedule",
           {{"lr", train.lr}, {"min_lr", train.min_lr}, {"warmup_steps", train.warmup_steps}, {"steps", train.steps}}},
          {"loss", "mse(student(x_t, t, context[:context_lens]), teacher_out)"},
          {"trainable", names},
          {"steps", steps}};
}

void dump(const fs::path& out) {
  // The tiny job as `train` runs it without --config: the builtin teacher's config, the
  // [student] and [train] defaults (configs/tiny.ini), fp32 on the host, one thread.
  set_intra_op_threads(1);
  const student::StudentConfig scfg;
  const student::TrainConfig train;
  const auto teacher_dir = (out / "teacher").string();
  write_random_wan_checkpoint(teacher_dir, WanConfig::preset("tiny"), torch::kBFloat16, 2'000'000'000ULL,
                              kTeacherSeed);
  const auto teacher = WanCheckpoint::open(teacher_dir);
  const auto& tc = teacher.config();
  const auto sc = scfg.model_config(tc);

  WD_CHECK(tc.model_type == "t2v" && sc.in_dim == tc.in_dim && sc.out_dim == tc.out_dim &&
               scfg.feature_pairs().empty() && scfg.precision == Precision::kFp32 && train.grad_accum == 1,
           "the reference covers the tiny job: a t2v teacher, the DiT alone (no projections or "
           "feature heads), fp32, one micro-batch");
  const auto plan = tiny_plan(tc, train);

  student::PartsSetup setup;
  setup.teacher_in_channels = plan.latent[0];
  setup.teacher_out_channels = plan.out_channels;
  setup.teacher_dim = tc.dim;
  setup.feature_weight = scfg.feature_weight;
  setup.train_projections = scfg.projection == Projection::kTrained;
  setup.mixed_bf16 = scfg.precision == Precision::kBf16Mixed;
  setup.seed = train.seed;
  setup.device = torch::kCPU;
  student::StudentParts parts(student::build_student(sc, scfg, &teacher, train.seed), setup);
  const auto& params = parts.trainable();
  const auto& names = parts.trainable_names();
  write_safetensors((out / "initial.safetensors").string(), named(names, params), {{"format", "pt"}});

  SeededBatches batches(plan.message_spec());
  comm::MpiGradientReducer reducer(MPI_COMM_WORLD, params, 25'000'000ULL, 60, 0, nullptr);
  student::TrainOptimizer optimizer(params, student::TrainOptimizer::options(train.lr, train));
  student::StudentJob job{parts, batches, reducer, optimizer, plan, train, MPI_COMM_WORLD, 60, 0, {}, true, "",
                          scfg.checkpointing};
  // The loop saves after every optimizer step: the grads are then those the optimizer used
  // (averaged, clipped), and the training state holds the parameters and moments it produced.
  std::vector<double> lrs;
  torch::optim::AdamWOptions options;
  job.checkpoint_every = 1;
  job.save = [&](std::int64_t step, student::TrainOptimizer& trained) {
    auto& optimizer = trained.adamw();
    std::vector<torch::Tensor> grads;
    for (const auto& p : params) grads.push_back(p.grad());
    const auto dir = step_dir(out, step);
    write_safetensors((dir / "grads.safetensors").string(), named(names, grads), {{"format", "pt"}});
    student::save_train_state(dir.string(), parts, optimizer, {step}, "", /*export_student=*/false);
    options = static_cast<torch::optim::AdamWOptions&>(optimizer.param_groups().front().options());
    lrs.push_back(options.lr());
  };
  const auto stats = student::run_student(job);

  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (std::int64_t s = 0; s < kSteps; ++s) {
    write_safetensors((step_dir(out, s + 1) / "batch.safetensors").string(),
                      batches.received.at(static_cast<std::size_t>(s)), {{"format", "pt"}});
    steps.push_back({{"step", s + 1}, {"loss", stats.losses.at(static_cast<std::size_t>(s))},
                     {"lr", lrs.at(static_cast<std::size_t>(s))}});
  }
  const auto meta = describe(sc, options, train, names, steps);
  write_file_atomically((out / "reference.json").string(), meta.dump(2) + "\n");
  spdlog::info("{} steps of the tiny student written to {}", kSteps, out.string());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    comm::MpiRuntime mpi(&argc, &argv);
    if (argc != 2 || mpi.size() != 1) {
      std::cerr << "usage: mpirun -n 1 dump_train_steps OUT_DIR\n";
      return 2;
    }
    fs::create_directories(argv[1]);
    dump(argv[1]);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "dump_train_steps: " << e.what() << "\n";
    return 1;
  }
}
