// student.sequence_parallel: the checks before training and a student rank's group
// (docs/sequence-parallel.md).
#include <spdlog/spdlog.h>

#include "comm/mpi_check.hpp"
#include "comm/token_head_exchange_factory.hpp"
#include "core/sequence_groups.hpp"
#include "job/plan_input.hpp"
#include "job/startup.hpp"
#include "job/student_side.hpp"
#include "objective/dmd.hpp"

namespace wd::job {

void check_sequence_parallel(const RunConfig& cfg, const WanExperts* experts, const comm::Layout& layout) {
  const auto n = cfg.student.sequence_parallel;
  if (n <= 1) return;
  const auto sp = "student.sequence_parallel(" + std::to_string(n) + ")";
  ConfigProblems p;
  const auto not_built = [&](bool ok, const std::string& what) {
    p.check(ok, sp + " with " + what + " is not built yet (docs/sequence-parallel.md)");
  };
  // A group reads one stream of a teacher cache (cache_stream_of), as it shares one online.
  not_built(!layout.colocated() || cfg.from_cache(),
            experts ? "teacher.placement colocated (each student computing its own targets)"
                    : "train.objective " + cfg.train.objective + " (no teacher rank)");
  not_built(cfg.comm.mode != CommMode::kBroadcast, "comm.mode broadcast");
  not_built(cfg.student.feature_pairs().empty(), "student.features");
  if (experts) {
    const auto& teacher = experts->expert(0).config();
    const auto student = cfg.student.lora_rank > 0 ? teacher : cfg.student.model_config(teacher);
    not_built(student.in_dim == teacher.in_dim && student.out_dim == teacher.out_dim,
              "a student whose channels differ from the teacher's (student.in_dim/out_dim: channel projections)");
    const auto heads_split = [&](std::int64_t heads, const std::string& whose, const std::string& or_else) {
      p.check(heads % n == 0, sp + " must divide " + whose + " num_heads (" + std::to_string(heads) +
                                  "); sizes that work: " + sequence_parallel_sizes(heads) + or_else);
    };
    heads_split(student.num_heads, "the student's", "");
    if (cfg.objective().traits().real_score) {
      // The critic splits its tokens as the generator does: a LoRA critic has the teacher's heads.
      const auto critic = objective::critic_lora(cfg.keys(), teacher.num_layers).rank > 0
                              ? teacher
                              : objective::critic_model_config(cfg.keys(), teacher);
      heads_split(critic.num_heads, "the dmd critic's", " (or set critic.num_heads)");
    }
  }
  if (layout.colocated()) {  // no teacher rank (a teacher cache): groups of the student world
    p.check(SequenceGroups{static_cast<int>(n)}.divides(layout.student_ranks),
            sp + " must divide the " + std::to_string(layout.student_ranks) + " student rank(s)");
  } else {
    const auto per_replica = layout.replicas > 0 ? layout.student_ranks / layout.replicas : layout.student_ranks;
    p.check(SequenceGroups{static_cast<int>(n)}.divides(per_replica),
            sp + " must divide the student ranks of each teacher replica: " + std::to_string(layout.student_ranks) +
                " student rank(s) over " + std::to_string(layout.replicas) + " replica(s) is " +
                std::to_string(per_replica) + " each; a group shares its replica's samples");
  }
  p.throw_if_any("train config");
}

void check_sequence_tokens(const RunConfig& cfg, const WanConfig& model, const std::array<std::int64_t, 4>& latent) {
  const auto n = cfg.student.sequence_parallel;
  if (n <= 1) return;
  const auto tokens = tokens_per_sample(model, latent);
  WD_CHECK_AS(ConfigError, tokens >= n,
              "student.sequence_parallel(" << n << ") is larger than the " << tokens
                                           << " tokens of a sample of the data set (latent " << latent[0] << "x"
                                           << latent[1] << "x" << latent[2] << "x" << latent[3]
                                           << "): each rank of a group needs at least one");
}

SequenceGroup::~SequenceGroup() {
  exchange.reset();
  if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
}

std::unique_ptr<SequenceGroup> open_sequence_group(const TrainJob& job, const c10::Device& device,
                                                   RoleServices& services) {
  const auto n = job.cfg.student.sequence_parallel;
  if (n <= 1) return nullptr;
  int index = 0;
  WD_CHECK_MPI(MPI_Comm_rank(job.groups->students(), &index));
  auto group = std::make_unique<SequenceGroup>();
  // Consecutive student indices: a replica's slots are consecutive, and N divides their count.
  const SequenceGroups groups{static_cast<int>(n)};
  WD_CHECK_MPI(MPI_Comm_split(job.groups->students(), groups.group_of(index), index, &group->comm));
  if (index == 0) {
    spdlog::info("sequence parallelism: {} group(s) of {} student ranks, each rank holding 1/{} of every sample's "
                 "tokens",
                 groups.groups_in(job.layout.student_ranks), n, n);
  }
  group->exchange = comm::make_token_head_exchange(group->comm, device, job.cfg.comm.backend, job.cfg.comm.timeout_s,
                                                   job.world_rank(), &services.health);
  return group;
}

}  // namespace wd::job
