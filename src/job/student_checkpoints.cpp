// A student rank's checkpoint hooks (restore, save with the moment slices of every student)
// and the end of its run (the student saved by the first student).
#include <spdlog/spdlog.h>

#include <cstring>
#include <filesystem>
#include <functional>

#include "comm/mpi_check.hpp"
#include "comm/wait.hpp"
#include "job/student_side.hpp"
#include "student/train_state.hpp"

namespace wd::job {

namespace {

namespace fs = std::filesystem;

/// student.shard: every student writes its own moment slices into the checkpoint the first one
/// is writing. That one's temporary directory goes to every student (`dir`: the first student's;
/// ignored elsewhere), each writes its slices there (`write`), and all agree they have before
/// the first seals it. Collective over the students; waits with the deadline, polling health.
void write_slices_together(const TrainJob& job, const std::string& dir, std::int64_t step,
                           comm::HealthChannel* health, const std::function<void(const std::string&)>& write) {
  constexpr std::int64_t kMax = 4096;
  WD_CHECK(static_cast<std::int64_t>(dir.size()) < kMax, "checkpoint directory name longer than " << kMax << ": " << dir);
  auto buffer = torch::zeros({kMax}, torch::kChar);
  std::memcpy(buffer.data_ptr(), dir.data(), dir.size());
  std::vector<int> peers;
  for (int r : job.layout.student_world_ranks()) {
    if (r != job.world_rank()) peers.push_back(r);
  }
  const auto wait = [&](MPI_Request& request, const char* op) {
    try {
      comm::wait_with_deadline(request, {op, step, static_cast<std::uint64_t>(kMax), peers},
                               std::chrono::duration<double>(job.cfg.comm.timeout_s), job.world_rank(), health);
    } catch (...) {
      comm::keep_until_exit(buffer);
      throw;
    }
  };
  MPI_Request request;
  WD_CHECK_MPI(MPI_Ibcast(buffer.data_ptr(), static_cast<int>(kMax), MPI_CHAR, 0, job.groups->students(), &request));
  wait(request, "share checkpoint directory");
  const std::string shared(static_cast<const char*>(buffer.data_ptr()));
  if (dir.empty()) write(shared);  // the first student wrote its slices with its files
  WD_CHECK_MPI(MPI_Ibarrier(job.groups->students(), &request));
  wait(request, "write moment slices");
}

}  // namespace

void attach_checkpoints(student::StudentJob& loop, TrainJob& job, student::StudentParts& parts,
                        RoleServices& services, const c10::Device& device) {
  loop.checkpoint_every = job.cfg.checkpoint.every;
  student::EmaWeights* ema = loop.ema;
  student::StudentMethod* method = loop.method;
  if (!job.resume_path.empty()) {
    loop.restore = [&job, &parts, ema, method](student::TrainOptimizer& optimizer) {
      student::Trainable{parts, optimizer}.restore(job.resume_path, job.plan.first_step, "the manifest's");
      if (ema) ema->restore(job.resume_path, parts);
      if (method) method->restore(job.resume_path);
    };
  }
  loop.save = [&job, &parts, ema, method, &services, device](std::int64_t step, student::TrainOptimizer& optimizer) {
    // Every student joins the gathers (student.shard parameters' whole weights and the slices'
    // step counts, the student's and then the method's share: dmd's critic and cycle request
    // inputs); the first one writes, the others add their moment slices.
    const student::TrainableSave own(student::Trainable{parts, optimizer}, step);
    const auto share = method ? method->begin_save(step) : std::make_unique<student::MethodCheckpoint>();
    const bool sliced = own.sliced() || share->sliced();
    const auto write_slices = [&](const std::string& dir) {
      own.write_slice(dir);
      share->write_slice(dir);
    };
    if (!job.store) {
      if (sliced) write_slices_together(job, "", step, &services.health, write_slices);
      return;
    }
    const auto path = job.store->save(step, [&](const std::string& dir) {
      // With a weight average, checkpoints keep both and student/ holds the average.
      own.write(dir, job.config_ini, /*export_student=*/ema == nullptr);
      share->write(dir, job.config_ini);
      if (ema) {
        ema->save(dir, parts);
        ema->with_averaged(parts, [&] { parts.save((fs::path(dir) / student::TrainStateFiles::kStudent).string()); });
      }
      if (sliced) write_slices_together(job, dir, step, &services.health, write_slices);
      // Mid-save: the files are written, the checkpoint is neither sealed nor renamed.
      services.faults.at(FaultSpec::Point::kSave, step, device);
    });
    spdlog::info("checkpoint of step {} written to {}", step, path);
  };
}

RoleResult finish_student(const TrainJob& job, const student::StudentStats& stats, student::StudentParts& parts,
                          const student::EmaWeights* ema, bool first) {
  const auto& plan = job.plan;
  RoleResult result;
  result.requeue = stats.stopped_after >= 0;
  result.summary = {1, stats.seconds, 1 - stats.wait_seconds / stats.seconds, stats.wait_seconds / stats.seconds,
                    static_cast<double>((plan.train_steps - plan.first_step) * plan.micro_batches *
                                        plan.batch_per_student),
                    0};
  if (first && !result.requeue) {
    const auto dir = (fs::path(job.cfg.run_dir) / "student").string();
    if (ema) {
      ema->with_averaged(parts, [&] { parts.save(dir); });
    } else {
      parts.save(dir);
    }
    spdlog::info("student{} saved to {} ({} params); held-out relative MSE {:.5f} -> {:.5f}; "
                 "{:.1f} s, waiting for batches {:.0f}%",
                 ema ? " (its weight average, train.ema_decay)" : "", dir,
                 static_cast<std::int64_t>(parts.models().size()) * wan_param_count(parts.model()->config()),
                 stats.first_eval_rel_mse,
                 stats.final_eval_rel_mse, stats.seconds, 100 * stats.wait_seconds / stats.seconds);
  }
  return result;
}

}  // namespace wd::job
