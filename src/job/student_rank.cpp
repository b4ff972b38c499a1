// run_student_rank: a student rank's wiring (device, stream, models, reducers, dmd's critic,
// checkpoint hooks: student_side.hpp) and its loop.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>

#include "comm/mpi_check.hpp"
#include "comm/transport_factory.hpp"
#include "core/torch_compat.hpp"
#include "job/student_side.hpp"
#include "student/student_device.hpp"

namespace wd::job {

namespace {

namespace fs = std::filesystem;

/// Warns when this rank's GPU is shared with other students. A GPU is told by its PCI bus id,
/// gathered from every student (collective over the student group), not by its CUDA index:
/// under per-rank CUDA_VISIBLE_DEVICES every rank sees its own GPU as cuda:0. A teacher on this
/// GPU shows in the link's backend line instead.
void warn_if_gpu_shared(const TrainJob& job, const c10::Device& device, comm::HealthChannel& health) {
  if (!device.is_cuda()) return;  // student.device is one setting: every student returns here alike
  const auto ends = comm::gather_devices(job.groups->students(), job.world_rank(), device,
                                         job.cfg.comm.timeout_s, "exchange student devices", &health);
  const auto others = comm::sharing_gpu_with(ends, job.world_rank());
  if (others.empty()) return;
  std::string names;
  for (const auto& other : others) names += (names.empty() ? "" : ", ") + other.describe();
  const auto me = std::find_if(ends.begin(), ends.end(),
                               [&](const comm::RankDevice& e) { return e.world_rank == job.world_rank(); });
  spdlog::warn("this rank's GPU, {}, is shared with {}: links and the gradient all-reduce between "
               "ranks on one GPU go over MPI (NCCL refuses two ranks on one GPU)",
               me->describe(), names);
}

/// This rank's device, current before anything is allocated (pinned link and gradient buffers
/// open a CUDA context on the current device): every rank on its own GPU, none on GPU 0 by default.
c10::Device take_student_device(const TrainJob& job, RoleServices& services) {
  const auto& cfg = job.cfg;
  const auto device = student::student_device(cfg.student.device, job.topo.local_rank);
  compat::set_current_device(device);
  if (device.is_cuda()) compat::allow_tf32_matmul(cfg.student.tf32);
  services.memory.device = device;
  warn_if_gpu_shared(job, device, services.health);
  if (job.world_rank() == job.layout.student_world_ranks().front()) {
    spdlog::info("students train on {} (student.device {})", device.is_cuda() ? "their GPUs" : "the host",
                 name_of(cfg.student.device));
  }
  return device;
}

}  // namespace

RoleResult run_student_rank(TrainJob& job, RoleServices& services) {
  const auto& cfg = job.cfg;
  const auto& layout = job.layout;
  const int rank = job.world_rank();
  const auto device = take_student_device(job, services);
  // Link first (and dmd's channel), gradient groups second, on every student: NCCL communicators
  // are created in one order everywhere (docs/transport.md).
  auto stream = open_stream(job, device, services);
  DmdSide dmd;
  const bool real_score = job.plan.score_requests;
  // The real score: the replica's teacher rank (beside a link, or a cache), or this rank's own teacher.
  if (real_score && !layout.colocated()) open_service(dmd, job, device, services);
  if (real_score && layout.colocated()) dmd.score = local_score(*stream.own_stage());
  const auto sequence = open_sequence_group(job, device, services);  // outlives the parts, which use its exchange
  auto parts = make_student_parts(job, device, stream.own_stage(), sequence ? sequence->exchange.get() : nullptr);
  if (parts.model()->lora().rank > 0) {
    // A LoRA student's frozen base, reported as the frozen teacher weights this rank holds (the
    // tensors a colocated teacher already counted once: not again).
    std::set<const void*> counted;
    if (const auto* own = stream.own_stage()) {
      for (const auto& m : own->experts()) {
        for (const auto& p : m.model->parameters()) counted.insert(p.data_ptr());
      }
    }
    std::vector<torch::Tensor> base;
    for (const auto& model : parts.models()) {
      for (const auto& p : model->parameters()) {
        if (!p.requires_grad() && !counted.count(p.data_ptr())) base.push_back(p);
      }
    }
    services.memory.teacher_weights_bytes += memory::tensor_bytes(base);
  }
  const auto train = cfg.student_train();
  auto training = make_training(job, parts, device, services, train.lr);
  // The weights this rank keeps (student.shard parameters: its slice and the blocks' outside).
  services.memory.model.weights_bytes =
      student::kept_weight_bytes(parts.trainable(), training.optimizer->shard());
  int group_rank = 0;
  WD_CHECK_MPI(MPI_Comm_rank(job.groups->students(), &group_rank));
  std::vector<int> peers;
  for (int r : layout.student_world_ranks()) {
    if (r != rank) peers.push_back(r);
  }
  if (real_score) make_dmd_trainer(dmd, job, parts, device, group_rank, peers, services);
  student::StudentJob loop{parts, *stream.transport, *training.reducer, *training.optimizer, job.plan, train,
                           job.groups->students(),
                           cfg.comm.timeout_s, rank, peers, group_rank == 0,
                           (fs::path(cfg.run_dir) / "metrics.jsonl").string(),
                           cfg.student.checkpointing};
  loop.memory = &services.monitor;
  loop.health = &services.health;
  loop.faults = &services.faults;
  loop.teachers = layout.teacher_world_ranks();
  loop.tracked_memory = &services.memory.model;
  std::optional<student::EmaWeights> ema;
  if (train.ema_decay > 0) loop.ema = &ema.emplace(parts, train.ema_decay);
  loop.method = dmd.method.get();
  loop.sequence_parallel = static_cast<int>(cfg.student.sequence_parallel);
  attach_checkpoints(loop, job, parts, services, device);
  const auto stats = student::run_student(loop);
  const student::WholeWeights whole(training.optimizer->shard());  // student.shard parameters: the first student writes them all
  return finish_student(job, stats, parts, loop.ema, group_rank == 0);
}

}  // namespace wd::job
