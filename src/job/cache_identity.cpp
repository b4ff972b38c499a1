// The identity of a job's teacher stream and the train side's checks of a teacher cache (cache_identity.hpp).
#include <spdlog/spdlog.h>

#include <sstream>

#include "core/checksum.hpp"
#include "core/sequence_groups.hpp"
#include "data/dataset_reader.hpp"
#include "job/cache_identity.hpp"
#include "job/generate.hpp"
#include "objective/objective_spec.hpp"
#include "teacher/trajectory.hpp"

namespace wd::job {

namespace {

/// The keys whose values decide the teacher's batches (besides every noise.* key).
const char* const kIdentityKeys[] = {
    "train.objective", "teacher.guidance", "teacher.steps", "teacher.shift", "teacher.solver", "teacher.dtype",
    "teacher.compute", "teacher.boundary", "student.steps", "student.expert", "train.seed", "train.batch_size",
    "train.grad_accum", "train.eval_samples", "train.trajectory_rollout", "data.ignore_condition"};

/// Of those, the keys that decide how a round's trajectories are dealt into batches, not the
/// trajectories: a cache of whole trajectories (generate --keep) serves every value of them.
const char* const kDealingKeys[] = {"student.steps", "student.expert", "train.grad_accum",
                                    "train.trajectory_rollout"};

/// Every key of `cfg` with its value as the config writes it ("teacher.shift" -> "5").
std::map<std::string, std::string> config_values(RunConfig cfg) {
  OptionTable table("");
  cfg.bind(table);
  std::map<std::string, std::string> out;
  std::istringstream ini(table.to_ini());
  std::string line, section;
  while (std::getline(ini, line)) {
    if (line.empty()) continue;
    if (line.front() == '[') {
      section = line.substr(1, line.size() - 2) + ".";
      continue;
    }
    const auto eq = line.find(" = ");
    if (eq != std::string::npos) out[section + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

std::string teacher_xxh64(const WanExperts& teacher) {
  Xxh64 h;
  for (const auto& e : teacher.experts()) {
    for (const auto& f : e.files()) {
      const auto file = file_xxh64_hex(f.path());
      h.update(file.data(), file.size());
    }
  }
  return xxh64_hex(h.digest());
}

std::string data_fingerprint(const data::DatasetInfo& info) {
  data::DatasetReader reader(info);
  const auto b = reader.read({0, info.samples - 1});
  Xxh64 h;
  h.update(&info.samples, sizeof(info.samples));
  h.update(info.latent_shape.data(), sizeof(info.latent_shape));
  for (const auto* t : {&b.latents, &b.context, &b.context_lens, &b.condition}) {
    if (!t->defined()) continue;
    const auto c = t->contiguous();
    h.update(c.data_ptr(), c.numel() * c.element_size());
  }
  return xxh64_hex(h.digest());
}

}  // namespace

teacher::CacheIdentity cache_identity(const RunConfig& cfg, const WanExperts& teacher, const data::DatasetInfo& data,
                                      std::int64_t keep) {
  const auto values = config_values(cfg);
  teacher::CacheIdentity id;
  for (const auto* key : kIdentityKeys) id[key] = values.at(key);
  if (keep > 0) {
    for (const auto* dealt : kDealingKeys) id.erase(dealt);
  }
  for (const auto& [key, value] : values) {
    if (key.rfind("noise.", 0) == 0) id[key] = value;
  }
  const auto& negative = cfg.teacher.negative;
  id["teacher.negative"] = negative.empty() ? "" : "xxh64 " + file_xxh64_hex(negative);
  id["teacher"] = "xxh64 " + teacher_xxh64(teacher);
  id["data"] = "fingerprint " + data_fingerprint(data);
  return id;
}

namespace {

/// A cache of whole trajectories (generate --keep) against the train that deals them: its
/// student.steps must divide the cache's K, its held-out messages fit the held-out rounds, and
/// with data.teacher_cache_end stop its training rounds cover train.steps. Returns the training
/// batches the cache covers for this train.
std::int64_t check_trajectory_cache(const TrainJob& job, const teacher::CacheLayout& l) {
  const auto& dir = job.cfg.data.teacher_cache;
  const auto k = job.cfg.student.steps;
  WD_CHECK_AS(ConfigError, l.keep % k == 0,
              "data.teacher_cache(" << dir << ") holds trajectories at " << l.keep + 1 << " points (generate --keep "
                                    << l.keep << "); student.steps(" << k << ") must divide " << l.keep
                                    << " (its σ must be points of them)");
  const auto m = objective::batches_per_round(job.cfg.keys(), job.student_range());
  const auto eval_rounds = (job.plan.eval_messages + m - 1) / m;
  WD_CHECK_AS(ConfigError, l.batch == job.plan.batch_per_student && eval_rounds <= l.eval_messages,
              "data.teacher_cache(" << dir << ") holds " << l.eval_messages << " held-out round(s) of " << l.batch
                                    << " trajectories per student; this train needs " << eval_rounds << " of "
                                    << job.plan.batch_per_student);
  const auto positions = job.plan.train_steps * job.plan.micro_batches;
  WD_CHECK_AS(ConfigError, job.cfg.data.teacher_cache_end != data::CacheEnd::kStop || positions <= l.positions * m,
              "data.teacher_cache(" << dir << ") holds " << l.positions << " trajectory rounds per student, "
                                    << l.positions * m << " training batches of this train's " << m
                                    << " interval(s) a round; it needs " << positions << " (train.steps("
                                    << job.plan.train_steps << ") x train.grad_accum(" << job.plan.micro_batches
                                    << ")) and data.teacher_cache_end is stop: set train.steps <= "
                                    << l.positions * m / job.plan.micro_batches
                                    << ", generate a longer cache, or set data.teacher_cache_end cycle");
  return l.positions * m;
}

/// A cache of messages against the train that reads them: its held-out messages and batch are the
/// train's, and with data.teacher_cache_end stop its training messages cover train.steps.
/// Returns the training batches it holds.
std::int64_t check_message_cache(const TrainJob& job, const teacher::CacheLayout& l) {
  const auto& dir = job.cfg.data.teacher_cache;
  WD_CHECK_AS(ConfigError, l.eval_messages == job.plan.eval_messages && l.batch == job.plan.batch_per_student,
              "data.teacher_cache(" << dir << ") holds " << l.eval_messages << " held-out message(s) of " << l.batch
                                    << " sample(s) per student; this train needs " << job.plan.eval_messages << " of "
                                    << job.plan.batch_per_student);
  const auto positions = job.plan.train_steps * job.plan.micro_batches;
  WD_CHECK_AS(ConfigError, job.cfg.data.teacher_cache_end != data::CacheEnd::kStop || positions <= l.positions,
              "data.teacher_cache(" << dir << ") holds " << l.positions << " training batches per student; this "
                                    << "train needs " << positions << " (train.steps(" << job.plan.train_steps
                                    << ") x train.grad_accum(" << job.plan.micro_batches << ")) and "
                                    << "data.teacher_cache_end is stop: set train.steps <= "
                                    << l.positions / job.plan.micro_batches << ", generate a cache of "
                                    << job.plan.train_steps << " steps, or set data.teacher_cache_end cycle");
  return l.positions;
}

}  // namespace

int cache_streams(const RunConfig& cfg, const comm::Layout& layout) {
  return SequenceGroups{static_cast<int>(cfg.student.sequence_parallel)}.groups_in(layout.student_ranks);
}

int cache_stream_of(const TrainJob& job, int rank) {
  return SequenceGroups{static_cast<int>(job.cfg.student.sequence_parallel)}.group_of(job.layout.student_index(rank));
}

void check_teacher_cache(const TrainJob& job) {
  const auto& dir = job.cfg.data.teacher_cache;
  const auto index = teacher::read_cache_index(dir);
  const auto& l = index.layout;
  teacher::check_identity("data.teacher_cache(" + dir + ")", index.identity,
                          cache_identity(job.cfg, *job.experts, *job.info, l.keep), "this train");
  const auto sp = job.cfg.student.sequence_parallel;
  const auto streams = cache_streams(job.cfg, job.layout);
  WD_CHECK_AS(ConfigError, l.students == streams,
              "data.teacher_cache(" << dir << ") holds the streams of " << l.students << " student rank(s); this train "
                                    << "has " << streams
                                    << (sp > 1 ? " sequence-parallel group(s) of " + std::to_string(sp) +
                                                     " ranks, a stream each"
                                               : std::string(""))
                                    << " (run it on " << l.students * sp << " ranks, or generate with --students "
                                    << streams << ")");
  const auto covered = l.keep > 0 ? check_trajectory_cache(job, l) : check_message_cache(job, l);
  const auto positions = job.plan.train_steps * job.plan.micro_batches;
  // A student reads its stream (cache_stream_of); a teacher rank beside the cache (dmd's real score) none.
  if (job.topo.role == Role::kStudent) teacher::verify_stream(dir, index, cache_stream_of(job, job.world_rank()));
  if (job.world_rank() != 0) return;
  spdlog::info("data.teacher_cache {}: {} training batches per student for {} this run reads{}{}; every shard's "
               "checksum verified",
               dir, covered, positions,
               l.keep > 0 ? fmt::format(" (dealt from {} rounds of whole trajectories, {} states each)", l.positions,
                                        l.keep + 1)
                          : std::string(),
               positions > covered ? " (past the cache's end it reads the cache again from the start)" : "");
}

namespace {

/// The layout of the cache a train writes: generate's for its student ranks and
/// data.teacher_cache_shard_positions (cache_layout), with `replicas` set where teacher replicas
/// serve several students each (CacheLayout::replicas). One replica per stream (a colocated
/// train's, or as many teacher replicas as students) is generate's own: generate completes or
/// extends such a cache.
teacher::CacheLayout written_cache_layout(const TrainJob& job) {
  const auto& layout = job.layout;
  const int streams = cache_streams(job.cfg, job.layout);
  auto l = cache_layout(job.cfg, streams, job.cfg.data.teacher_cache_shard_positions);
  l.replicas = layout.colocated() || layout.replicas == streams ? 0 : layout.replicas;
  return l;
}

}  // namespace

void claim_written_cache(const TrainJob& job) {
  const auto& cfg = job.cfg;
  const auto& dir = cfg.data.teacher_cache_write;
  ConfigProblems p;
  objective::check_cacheable(cfg.keys(), p);
  const auto not_built = [&](bool ok, const std::string& what) {
    p.check(ok, "data.teacher_cache_write with " + what + " is not built yet");
  };
  not_built(job.layout.stages == 1, "teacher.stages(" + std::to_string(job.layout.stages) +
                                        ") > 1 (a pipeline's last stage holds the batches, its first the source)");
  not_built(!job.broadcast, "comm.mode broadcast (every student gets one batch)");
  p.throw_if_any("train keys");
  if (job.world_rank() != 0) return;
  const auto layout = written_cache_layout(job);
  teacher::claim_cache_dir(dir, cache_identity(cfg, *job.experts, *job.info), layout,
                           "data.teacher_cache_write(" + dir + ")", "this train");
  spdlog::info("data.teacher_cache_write {}: {} stream(s) of {} held-out and {} training messages of {} sample(s), "
               "{} shard(s), written as the teacher streams{}",
               dir, layout.students, layout.eval_messages, layout.positions, layout.batch,
               teacher::cache_shards(layout).size(),
               layout.replicas > 0 ? fmt::format(" ({} teacher replica(s) deal the samples of {} streams: a cache for "
                                                 "trains of {} student ranks, which generate cannot complete)",
                                                 layout.replicas, layout.students, layout.students)
                                   : std::string());
}

}  // namespace wd::job
