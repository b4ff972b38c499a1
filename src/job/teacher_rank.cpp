// run_teacher_rank: a teacher rank's wiring (device, link, stage model, stage links) and its loop.
#include <spdlog/spdlog.h>

#include <algorithm>

#include <optional>

#include "job/cache_identity.hpp"
#include "job/plan_input.hpp"
#include "job/train_job.hpp"
#include "core/torch_compat.hpp"
#include "comm/score_channel.hpp"
#include "comm/transport_factory.hpp"
#include "data/noiser.hpp"
#include "data/sample_schedule.hpp"
#include "teacher/cache_recorder.hpp"
#include "teacher/placement.hpp"
#include "teacher/teacher_loop.hpp"
#include "teacher/teacher_stage.hpp"

namespace wd::job {

teacher::TeacherStage load_teacher_stage(const TrainJob& job, const teacher::StageLoad& how, RankMemory& memory) {
  std::vector<teacher::StageModel> models;
  // student.expert without trajectories (dmd is refused with it): every t the teacher sees is on
  // that expert's side (the noisers redraw the rest), so the other expert never runs: not loaded.
  const bool one_expert = job.experts->two_experts() && !job.cfg.student.expert.empty() &&
                          !job.cfg.objective().reaches_every_expert(job.cfg.keys());
  std::vector<const WanCheckpoint*> load;
  if (one_expert) {
    load.push_back(&job.student_base());
  } else {
    for (const auto& e : job.experts->experts()) load.push_back(&e);
  }
  for (const auto* e : load) {
    auto expert = how;
    expert.arena_tag = "expert" + std::to_string(models.size());  // each expert its own arena segment
    models.push_back(teacher::load_stage_model(*e, expert));
    memory.teacher_weights_bytes += teacher::stage_weight_bytes(models.back());
  }
  if (one_expert && job.world_rank() == 0) {
    spdlog::info("student.expert {}: the teacher loads its {} expert alone ({}), the only one {} reaches", job.cfg.student.expert,
                 job.cfg.student.expert, job.student_base().path(), job.student_range().describe());
  }
  for (auto& m : models) m.model->set_compute_dtype(job.compute);
  if (job.world_rank() == 0 && job.micro_batch > 0) {
    spdlog::info("teacher forwards of {} sample(s) at a time (teacher.micro_batch)", job.micro_batch);
  }
  teacher::Router router;
  if (models.size() == 2) {
    router = [&job](const torch::Tensor& t) { return job.experts->route(t); };
  }
  teacher::TeacherStage stage(std::move(models), router, how.blocks, job.plan.feature_blocks);
  stage.set_micro_batch(job.micro_batch);
  job.cfg.objective().prepare_stage(job.cfg.keys(), stage, job.model.text_dim, job.student_range(),
                                    job.layout.colocated(), job.world_rank() == 0);
  return stage;
}

namespace {

/// Bytes of the real-score channel's rings on a teacher: a request and an answer ring per student.
std::uint64_t service_bytes(const comm::StreamPlan& plan, const comm::CommConfig& comm, int students) {
  const auto depth = static_cast<std::uint64_t>(comm.prefetch_depth);
  return (comm::request_spec(plan).bytes() + comm::answer_spec(plan).bytes()) * depth *
         static_cast<std::uint64_t>(students);
}

/// The last stage's links to its students: the batch stream (none when they read a cache) and,
/// for dmd, the real-score channel (made right after it; the students make theirs in the same
/// order in run_student_rank).
std::pair<std::unique_ptr<comm::Sender>, std::optional<comm::TeacherService>> open_student_links(
    const TrainJob& job, const c10::Device& device, RoleServices& services) {
  const auto& cfg = job.cfg;
  std::pair<std::unique_ptr<comm::Sender>, std::optional<comm::TeacherService>> out;
  if (job.groups->link() == MPI_COMM_NULL) return out;
  const int rank = job.world_rank();
  const auto students = job.layout.students_per_replica();
  if (!cfg.from_cache()) {
    out.first = comm::make_sender(comm::link_end(*job.groups, rank, cfg.comm), job.plan.message_spec(), cfg.comm, 0,
                                  job.plan.end_step(), device, &services.health);
    services.memory.transport_bytes = job.plan.message_spec().bytes() *
                                      static_cast<std::uint64_t>(cfg.comm.prefetch_depth) *
                                      static_cast<std::uint64_t>(students);
  }
  if (!job.plan.score_requests) return out;
  out.second = comm::teacher_service(*job.groups, rank, job.plan, service_schedule(cfg, job.plan), cfg.comm, device,
                                     &services.health);
  services.memory.transport_bytes += service_bytes(job.plan, cfg.comm, students);
  return out;
}

/// data.teacher_cache_write: the first stage's source, its batches also written as its replica's
/// students' streams of the cache.
std::unique_ptr<teacher::TargetSource> recorded(const TrainJob& job, std::unique_ptr<teacher::TargetSource> source) {
  // The replica's share of the cache's streams (a student's, or a sequence-parallel group's each):
  // slot j's message is stream j's.
  const int streams = cache_streams(job.cfg, job.layout) / job.layout.replicas;
  return std::make_unique<teacher::CacheRecorder>(std::move(source), job.cfg.data.teacher_cache_write,
                                                  job.layout.replica_of(job.world_rank()) * streams, streams,
                                                  job.plan.batch_per_student);
}

}  // namespace

RoleResult run_teacher_rank(TrainJob& job, RoleServices& services) {
  const auto& cfg = job.cfg;
  const auto& layout = job.layout;
  const int rank = job.world_rank();
  const auto [block_bytes, head_bytes] = teacher_block_bytes(job.teacher());
  const auto ranges = teacher::stage_ranges(cfg.teacher, layout.stages, block_bytes, head_bytes);
  const int stage = layout.stage_of(rank);
  teacher::StageLoad how;
  how.placement = job.placement;
  how.dtype = teacher_dtype(cfg);
  how.device = teacher::teacher_device(cfg.teacher, job.placement, job.topo.local_rank);
  // Before the pinned link buffers: cudaHostAlloc opens a context on the current device.
  compat::set_current_device(how.device);
  how.blocks = ranges[static_cast<std::size_t>(stage)];
  how.stream_ahead = cfg.teacher.stream_ahead;
  how.timeout_s = cfg.comm.timeout_s;
  how.arena_group = job.groups->teachers();  // stream: the node's teacher ranks share one arena
  how.arena_limit = cfg.teacher.arena_limit_bytes();
  how.copy_threads = cfg.teacher.copy_threads;
  services.memory.device = how.device;
  if (layout.stages > 1) {
    spdlog::info("teacher stage {}/{} of replica {}: blocks {}-{} on {}", stage + 1, layout.stages,
                 layout.replica_of(rank), how.blocks.begin, how.blocks.end - 1, how.device.str());
  }
  auto [transport, service] = open_student_links(job, how.device, services);
  auto stage_model = load_teacher_stage(job, how, services.memory);
  const auto per_stage_spec = [&](int s) {
    return teacher::stage_message_spec(
        job.plan, job.per_replica,
        teacher::TeacherStage::features_before(job.plan.feature_blocks, ranges[static_cast<std::size_t>(s)].end));
  };
  comm::StageStreams links;
  if (layout.stages > 1) {
    links = comm::make_stage_streams(*job.groups, rank, per_stage_spec(std::max(0, stage - 1)),
                                     per_stage_spec(stage), cfg.comm, 0, job.plan.end_step(), how.device,
                                     &services.health);
  }

  comm::Sender* sending = transport ? transport.get() : links.to_next.get();
  if (sending && services.faults.planned(FaultSpec::Point::kSend)) {
    sending->set_send_fault_hook([&faults = services.faults, &plan = job.plan, device = how.device](std::int64_t ts) {
      // Transport steps count the held-out messages and micro-batches: the step's first send.
      const auto step = plan.train_step_starting_at(ts);
      if (step >= 0) faults.at(FaultSpec::Point::kSend, step + 1, device);
    });
  }

  std::optional<data::DatasetReader> reader;
  data::SampleSchedule schedule(job.train_samples, job.per_replica, layout.replicas, cfg.train.seed);
  data::FlowMatchingNoiser noiser(cfg.noise, cfg.train.seed, job.student_range());
  data::FlowMatchingNoiser eval_noiser(cfg.noise, cfg.train.seed ^ 0xE7A1ULL, job.student_range());
  std::unique_ptr<teacher::TargetSource> source;  // the first stage's batches; beside a cache none
  if (stage == 0 && !cfg.from_cache()) {
    source = cfg.objective().source(cfg.keys(), {{reader.emplace(*job.info), schedule, noiser, eval_noiser,
                                                  layout.replica_of(rank), layout.replicas, job.per_replica,
                                                  job.train_samples},
                                                 &stage_model, job.plan, job.model.patch_size, job.student_range()});
    if (cfg.writes_cache()) source = recorded(job, std::move(source));
  }
  teacher::TeacherJob loop{stage_model, source.get(), transport.get(), job.plan, layout.students_per_replica(),
                           job.broadcast};
  loop.sequence_parallel = static_cast<int>(cfg.student.sequence_parallel);
  loop.memory = &services.monitor;
  loop.health = &services.health;
  loop.faults = &services.faults;
  loop.from_previous = links.from_previous.get();
  loop.to_next = links.to_next.get();
  std::optional<teacher::ScoreServer> server;
  if (service) {
    loop.server = &server.emplace(stage_model, *service, service_schedule(job.cfg, job.plan));
    server->set_faults(&services.faults);
    server->set_health(&services.health);
    server->set_sequence_parallel(static_cast<int>(std::max<std::int64_t>(1, job.cfg.student.sequence_parallel)));
  }
  const auto stats = teacher::run_teacher(loop);
  const RankSummary summary{0, stats.seconds, stats.busy_seconds / stats.seconds, stats.wait_seconds / stats.seconds,
                            static_cast<double>(stats.samples), 0};
  return {summary, stats.stopped_after >= 0};
}

}  // namespace wd::job
