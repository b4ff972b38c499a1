// `wan-distill plan`: each rank's predicted memory for every teacher placement, before anything
// is loaded, from the same config file `train` reads.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>
#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "job/cache_identity.hpp"
#include "job/calibrate.hpp"
#include "job/generate.hpp"
#include "job/plan_input.hpp"
#include "job/run_config.hpp"
#include "comm/process_groups.hpp"
#include "comm/stream_plan.hpp"
#include "core/logging.hpp"
#include "core/torch_compat.hpp"
#include "data/dataset_info.hpp"
#include "data/noiser.hpp"
#include "model/image_condition.hpp"
#include "model/safetensors.hpp"
#include "model/wan_checkpoint.hpp"
#include "model/wan_experts.hpp"
#include "objective/objective_spec.hpp"
#include "plan/planner.hpp"
#include "plan/speed.hpp"
#include "student/checkpointing.hpp"
#include "teacher/compute_dtype.hpp"
#include "teacher/placement.hpp"
#include "teacher/trajectory.hpp"

namespace wd::app {

namespace {

namespace fs = std::filesystem;

nlohmann::json rank_json(const plan::RankPlan& r) {
  nlohmann::json items = nlohmann::json::array();
  for (const auto& i : r.items) {
    items.push_back({{"name", i.name}, {"device_bytes", i.device}, {"host_bytes", i.host}, {"note", i.note}});
  }
  return {{"device_bytes", r.device_total()}, {"host_bytes", r.host_total()}, {"items", items}};
}

/// The plan as JSON (for scripts and the accuracy test).
nlohmann::json plan_json(const plan::Plan& plan) {
  nlohmann::json placements = nlohmann::json::array();
  for (const auto& pp : plan.placements) {
    nlohmann::json j{{"placement", plan::placement_name(pp.placement)}, {"applicable", pp.applicable},
                     {"fits", pp.fits}, {"why_not", pp.why_not}};
    if (pp.applicable) {
      j["teacher"] = rank_json(pp.teacher);
      if (!pp.student.items.empty()) {  // generate's plan has no student rank
        j["student"] = rank_json(pp.student);
        j["student_activations_off_bytes"] = pp.student_activations_off;
        j["student_activations_all_bytes"] = pp.student_activations_all;
      }
      j["host_per_node_bytes"] = pp.host_per_node;
    }
    placements.push_back(j);
  }
  return {{"placements", placements},
          {"recommended", plan.recommended ? plan::placement_name(*plan.recommended) : ""},
          {"reason", plan.reason},
          {"sequence_parallel_fits", plan.sequence_parallel_fits},
          {"sequence_parallel_placement",
           plan.sequence_parallel_placement ? plan::placement_name(*plan.sequence_parallel_placement) : ""}};
}

std::int64_t elem_bytes(c10::ScalarType t) { return static_cast<std::int64_t>(c10::elementSize(t)); }

nlohmann::json speed_json(const plan::SpeedInput& in, const std::vector<plan::LayoutSpeed>& layouts) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& l : layouts) {
    rows.push_back({{"layout", l.name}, {"colocated", l.colocated}, {"teacher_ranks", l.teacher_ranks},
                    {"stages", l.stages}, {"students", l.students}, {"samples_per_s", l.samples_per_s},
                    {"student_wait", l.student_wait}, {"bound", l.bound}, {"replica_batch", l.replica_batch},
                    {"micro_batch", l.micro_batch}, {"flags", plan::layout_flags(l)},
                    {"stream_overhead", l.stream_overhead}});
  }
  nlohmann::json by_size = nlohmann::json::array();
  for (const auto& [n, seconds] : in.teacher_measured_by_size) by_size.push_back({{"size", n}, {"s_per_sample", seconds}});
  return {{"teacher_gflops", in.teacher_gflops}, {"student_gflops", in.student_gflops},
          {"teacher_by_size", by_size},
          {"teacher_s_per_sample", plan::teacher_seconds_per_sample(in)},
          {"student_s_per_sample", plan::student_seconds_per_sample(in)},
          {"measured", in.teacher_measured_s > 0 && in.student_measured_s > 0}, {"cores", in.cores},
          {"stream", in.stream.on ? nlohmann::json{{"blocks", in.stream.blocks}, {"block_bytes", in.stream.block_bytes},
                                                   {"gbps", in.stream.gbps}, {"pcie_gbps", in.stream.pcie_gbps},
                                                   {"copy_s", plan::stream_copy_seconds(in.stream)},
                                                   {"source", in.stream.source}}
                                  : nlohmann::json()},
          {"layouts", rows}};
}

/// plan's own options (the job's are train's, job::RunConfig).
struct PlanOptions {
  std::string gpu_memory = "180GiB", host_memory = "2TiB", latent, preset;
  int gpus_per_node = 8, np = 0;
  std::int64_t experts = 0;
  bool cpu = false, json = false, generate = false;
  int students = 1;                   ///< --students (with --generate), generate's
  std::int64_t shard_positions = 64;  ///< --shard-positions (with --generate), generate's
  std::string keep;                   ///< --keep (with --generate), generate's
  double teacher_gflops = 0, student_gflops = 0;
  int cores = -1;
  Calibrate calibrate = Calibrate::kAuto;

  void bind(OptionTable& own) {
    own.bind("gpu-memory", gpu_memory, "memory of one GPU")
        .bind("host-memory", host_memory, "host memory of one node")
        .bind("gpus-per-node", gpus_per_node, "GPUs (= ranks) per node")
        .bind("np", np, "world ranks as given to mpirun; 0 = one node of --gpus-per-node ranks "
                        "(with --cpu: teacher.ranks x 3, the tiny job's 1 teacher + 2 students; "
                        "with --generate --cpu: 1)")
        .bind("generate", generate,
              "plan `wan-distill generate` with these keys instead of train: --np ranks, each a whole teacher "
              "writing the cache (no student rank), the cache's size on disk and its time")
        .bind("students", students, "with --generate: generate's --students (streams of the cache)")
        .bind("shard-positions", shard_positions, "with --generate: generate's --shard-positions")
        .bind("keep", keep, "with --generate: generate's --keep (all or K: whole trajectories, K + 1 states each)")
        .bind("cpu", cpu, "a CPU job (the CPU build): every rank on one host, teacher.placement cpu")
        .bind("latent", latent, "C,F,H,W of a latent when data.path does not exist yet "
                                "(default for builtin:tiny: in_dim,3,16,16)")
        .bind("preset", preset, "plan for a WanConfig preset instead of teacher.checkpoint "
                                "(tiny, wan22-ti2v-5b, wan22-t2v-a14b, wan22-i2v-a14b)")
        .bind("json", json, "print the plan as JSON instead of tables")
        .bind("teacher-gflops", teacher_gflops,
              "sustained GFLOP/s of one rank's teacher forward; 0 = measured here (a matmul in the "
              "teacher's compute dtype, one thread, times plan::kForwardEfficiency)")
        .bind("student-gflops", student_gflops,
              "sustained GFLOP/s of one rank's student step; 0 = measured here (fp32, one thread, "
              "times plan::kTrainEfficiency)")
        .bind("cores", cores, "cores the ranks share; -1 = this host's with --cpu, else a GPU per rank")
        .bind("calibrate", calibrate,
              "with --cpu, or on a machine with a GPU (cuda:0, taken to be like the job's): time one "
              "teacher forward and one student step of this job there (random "
              "weights) for the speed prediction (auto: when the forward of one batch is estimated under "
              "60 s)")
        .bind("experts", experts, "MoE experts held by each teacher rank (Wan 2.2 A14B has 2); "
                                  "0 = 2 when teacher.checkpoint is a two-expert folder, else 1");
  }
  void validate() const {
    ConfigProblems p;
    p.check(gpus_per_node >= 1, "gpus-per-node(" + std::to_string(gpus_per_node) + ") must be >= 1");
    p.check(np >= 0, "np(" + std::to_string(np) + ") must be >= 0");
    p.check(experts >= 0, "experts(" + std::to_string(experts) + ") must be >= 0");
    p.check(generate || (students == 1 && shard_positions == 64 && keep.empty()),
            "students(" + std::to_string(students) + "), shard-positions(" + std::to_string(shard_positions) +
                ") and keep(" + keep + ") are generate's: plan them with --generate");
    p.throw_if_any("plan");
  }
};

/// The teacher planned for: a preset, the checkpoint's config.json (headers only), or the
/// builtin tiny preset.
struct PlannedTeacher {
  WanConfig config;
  std::int64_t stored_bytes = 2;
  std::int64_t experts = 1;
  std::string source;
};

PlannedTeacher planned_teacher(const job::RunConfig& cfg, const PlanOptions& o) {
  PlannedTeacher t;
  const auto dtype = dtype_of(cfg.teacher.dtype);
  t.stored_bytes = dtype ? elem_bytes(*dtype) : 2;
  t.experts = o.experts;
  if (!o.preset.empty()) {
    t.config = WanConfig::preset(o.preset);
    t.source = "preset " + o.preset;
  } else if (cfg.teacher.checkpoint == job::kBuiltin) {
    t.config = WanConfig::preset("tiny");
    t.stored_bytes = 2;  // the builtin teacher is written in bf16
    t.source = job::kBuiltin;
  } else if (fs::exists(cfg.teacher.checkpoint)) {
    // A two-expert (A14B) folder: both experts' headers, one architecture, two sets of weights.
    const auto teacher = job::open_teacher(cfg);
    if (t.experts == 0) t.experts = static_cast<std::int64_t>(teacher.size());
    t.config = teacher.config();
    t.stored_bytes = job::stored_elem_bytes(teacher.expert(0));
    t.source = cfg.teacher.checkpoint;
  } else if (!cfg.teacher.model_config.empty()) {
    t.config = WanConfig::load(cfg.teacher.model_config);
    t.source = cfg.teacher.model_config;
  } else {
    throw ConfigError("teacher.checkpoint(" + cfg.teacher.checkpoint +
                      ") does not exist here; give --teacher.model_config FILE (its config.json) or "
                      "--preset NAME to plan without it");
  }
  if (t.experts == 0) t.experts = 1;
  return t;
}

/// The latent shape and text length: from the data set when it exists, else --latent (builtin:
/// the tiny shape); each latent axis must divide by the patch.
std::pair<std::array<std::int64_t, 4>, std::int64_t> planned_latent(const job::RunConfig& cfg, const PlanOptions& o,
                                                                    const WanConfig& tc) {
  std::array<std::int64_t, 4> lat{};
  std::int64_t context_len = tc.text_len;
  const std::string data_path = cfg.data_path();
  if (o.latent.empty() && fs::exists(data_path)) {
    const auto info = data::validate_dataset(data_path, job::dataset_expectations(tc, cfg.data.ignore_condition));
    lat = info.latent_shape;
    context_len = info.context_len;
  } else if (!o.latent.empty()) {
    const auto d = parse_dims(o.latent, 4, "latent");
    lat = {d[0], d[1], d[2], d[3]};
  } else if (cfg.data.path == job::kBuiltin) {
    lat = {latent_channels_of(tc), 3, 16, 16};
  } else {
    throw ConfigError("data.path(" + cfg.data.path + ") does not exist here; give the latent size with --latent C,F,H,W");
  }
  ConfigProblems shape;
  for (int a = 0; a < 3; ++a) {
    shape.check(lat[a + 1] % tc.patch_size[a] == 0,
                "latent axis " + std::to_string(a + 1) + " (" + std::to_string(lat[a + 1]) +
                    ") is not divisible by the patch size " + std::to_string(tc.patch_size[a]));
  }
  shape.throw_if_any("plan");
  return {lat, context_len};
}

/// The speed prediction's input: rates measured where the job will compute (the host for a CPU
/// job, else a GPU of this machine when it has one, taken to be like the job's), or given.
std::optional<plan::SpeedInput> planned_speed(const job::RunConfig& cfg, const PlanOptions& o,
                                              const plan::PlanInput& in, const PlannedTeacher& t,
                                              const std::array<std::int64_t, 4>& lat, int world) {
  std::optional<c10::Device> measure_on;
  if (o.cpu) {
    measure_on = c10::Device(torch::kCPU);
  } else if (compat::cuda_available()) {
    measure_on = c10::Device(torch::kCUDA, 0);
  }
  return job::speed_input(cfg, in, t.config, job::timed_weight_dtype(cfg, t.stored_bytes), lat, world, measure_on,
                          o.cores, o.teacher_gflops, o.student_gflops, o.calibrate);
}

/// "teacher SOURCE: its shape, dtype, bytes" and a newline.
std::string teacher_line(const job::RunConfig& cfg, const PlannedTeacher& t, const plan::PlanInput& in) {
  return "teacher " + t.source + ": " + (t.experts > 1 ? std::to_string(t.experts) + " experts of " : "") +
         t.config.summary() + ", " + name_of(cfg.teacher.dtype) + ", " +
         format_bytes(static_cast<double>(in.teacher.params() * in.teacher_elem_bytes)) + "\n";
}

void print_plan(const job::RunConfig& cfg, const PlanOptions& o, const PlannedTeacher& t, const plan::PlanInput& in,
                const plan::Plan& plan, const std::optional<plan::SpeedInput>& speed,
                const std::vector<plan::LayoutSpeed>& layouts, const comm::Layout& layout,
                const std::array<std::int64_t, 4>& lat) {
  std::cout << teacher_line(cfg, t, in) << "student: " << cfg.student.model_config(t.config).summary() << ", " << cfg.student.precision
            << ", checkpointing " << cfg.student.checkpointing.str()
            << (in.sequence_parallel > 1 ? ", sequence parallel " + std::to_string(in.sequence_parallel) + " (" +
                                               std::to_string((in.tokens + in.sequence_parallel - 1) / in.sequence_parallel) +
                                               " tokens a rank)"
                                         : std::string())
            << "\n"
            << "job: " << layout.teacher_ranks << " teacher + " << layout.student_ranks << " student ranks"
            << (o.cpu ? " on one host (CPU job)" : ", " + std::to_string(o.gpus_per_node) + " GPUs per node")
            << "; batch " << cfg.train.batch_size << (in.sequence_parallel > 1 ? " per group" : " per student")
            << ", latent " << lat[0] << "x" << lat[1] << "x"
            << lat[2] << "x" << lat[3] << " = " << in.tokens << " tokens; message "
            << format_bytes(static_cast<double>(in.message_bytes)) << "\n\n"
            << plan::format_plan(in, plan) << "\n"
            << (speed ? plan::format_speeds(*speed, layouts)
                      : "speed: not predicted; give --teacher-gflops and --student-gflops (the sustained rates "
                        "of one GPU), run plan on a machine with a GPU like the job's, or plan a CPU job with "
                        "--cpu\n");
}

/// The planner's context: the teacher and latent planned for, `world` ranks, the machine of `o`.
job::PlanContext plan_context(const PlannedTeacher& t, const std::array<std::int64_t, 4>& lat,
                              std::int64_t context_len, int world, const PlanOptions& o) {
  job::PlanContext ctx;
  ctx.teacher = t.config;
  ctx.stored_elem_bytes = t.stored_bytes;
  ctx.experts = t.experts;
  ctx.latent = lat;
  ctx.context_len = context_len;
  ctx.world = world;
  ctx.cpu_job = o.cpu;
  ctx.gpu_bytes = parse_size(o.gpu_memory, "gpu-memory");
  ctx.host_bytes = parse_size(o.host_memory, "host-memory");
  ctx.gpus_per_node = o.gpus_per_node;
  return ctx;
}

/// What `generate` writes: its cache's messages, those of its busiest rank (shard i on rank
/// i mod ranks), and the bytes on disk (each message's tensors as the stream lays them out).
struct GenerateCount {
  teacher::CacheLayout layout;
  int ranks = 1;
  std::int64_t messages = 0;
  std::int64_t busiest = 0;
  std::uint64_t bytes = 0;
};

GenerateCount count_generate(const teacher::CacheLayout& layout, int ranks, std::int64_t message_bytes) {
  GenerateCount c{layout, ranks};
  for (int r = 0; r < ranks; ++r) {
    std::int64_t mine = 0;
    for (const auto& id : teacher::shards_of_rank(layout, r, ranks)) mine += id.count;
    c.messages += mine;
    c.busiest = std::max(c.busiest, mine);
  }
  c.bytes = static_cast<std::uint64_t>(c.messages) * static_cast<std::uint64_t>(message_bytes);
  return c;
}

void print_generate_plan(const job::RunConfig& cfg, const PlanOptions& o, const PlannedTeacher& t,
                         const plan::PlanInput& in, const plan::Plan& plan, const GenerateCount& c,
                         const std::optional<plan::SpeedInput>& speed) {
  const auto& l = c.layout;
  const std::string rows = l.keep > 0 ? "trajectory rounds" : "messages";
  std::cout << teacher_line(cfg, t, in) << "generate: " << c.ranks << " rank(s)" << (o.cpu ? " on one host (CPU job)" : "")
            << ", each a whole teacher, no student; " << l.students << " stream(s) of " << l.eval_messages
            << " held-out and " << l.positions << " training " << rows << " of " << l.batch << " sample(s), "
            << teacher::cache_shards(l).size() << " shard(s) of up to " << l.shard_positions << "\n\n"
            << plan::format_plan(in, plan) << "\n"
            << "cache on disk: " << c.messages << " " << rows << " x " << format_bytes(static_cast<double>(in.message_bytes))
            << " = " << format_bytes(static_cast<double>(c.bytes))
            << (l.keep > 0 ? " (each round's " + std::to_string(l.keep + 1) + " states of " + std::to_string(l.batch) +
                                 " trajectories, fp32"
                           : std::string(" (each message's tensors"))
            << "; the shards' HDF5 headers and checksums add a few KiB each)\n";
  if (!speed) {
    std::cout << "time: not predicted; give --teacher-gflops and --student-gflops, run plan on a machine with a GPU "
                 "like the job's, or plan a CPU job with --cpu\n";
    return;
  }
  // The rate the total is made of: the fastest timed forward size, with the per-message overhead.
  const double seconds = plan::generate_seconds(*speed, c.busiest);
  const double samples = static_cast<double>(std::max<std::int64_t>(1, c.busiest * l.batch));
  std::cout << fmt::format("time: {:.0f} s, the busiest rank's {} {} of {} sample(s) at {:.3f} s/sample "
                           "({:g} teacher forward(s) per sample{})\n",
                           seconds, c.busiest, rows, l.batch, seconds / samples, speed->teacher_forwards,
                           speed->cores > 0 ? fmt::format(", {} rank(s) sharing {} cores", c.ranks, speed->cores)
                                            : std::string(", a device each"));
}

/// The batches a trajectory round of these keys deals (generate --keep's rounds): student.steps,
/// or, with student.expert, the intervals starting on its side of the teacher's boundary
/// (teacher.boundary, else the model type's; the folder's own, which plan does not read, may
/// differ).
std::int64_t trained_per_round(const job::RunConfig& cfg, const PlannedTeacher& t, std::int64_t keep) {
  if (keep == 0) return 1;
  data::TimestepRange range;
  const auto boundary = cfg.teacher.boundary > 0 ? cfg.teacher.boundary
                                                 : default_expert_boundary(t.config.model_type).value_or(0.0);
  if (!cfg.student.expert.empty() && boundary > 0) {
    range.side = cfg.student.expert == "high" ? data::TimestepRange::kHigh : data::TimestepRange::kLow;
    range.boundary_timestep = boundary * 1000.0;
  }
  return objective::batches_per_round(cfg.keys(), range);
}

/// plan --generate: `generate`'s ranks with these keys (each a whole teacher as a colocated one
/// computes it, serving one stream at a time), its cache's size and its time.
int plan_generate(job::RunConfig cfg, const PlanOptions& o) {
  ConfigProblems cacheable;
  objective::check_cacheable(cfg.keys(), cacheable);
  cacheable.throw_if_any("train keys");
  const auto keep = job::keep_intervals(cfg, o.keep);
  init_logging(Topology::single_process(), cfg.log.level);
  const auto t = planned_teacher(cfg, o);
  const auto layout = job::cache_layout(cfg, o.students, o.shard_positions, keep, trained_per_round(cfg, t, keep));
  ConfigProblems with_teacher;
  job::validate_with_teacher(cfg, t.config, 1, with_teacher);
  with_teacher.throw_if_any("plan");
  const auto [lat, context_len] = planned_latent(cfg, o, t.config);
  const int ranks = o.np > 0 ? o.np : (o.cpu ? 1 : o.gpus_per_node);
  // A stream of the cache is what one teacher replica serving one student sends.
  cfg.teacher.ranks = 1;
  auto in = job::make_plan_input(cfg, plan_context(t, lat, context_len, 2, o));
  in.teacher_ranks = ranks;
  in.student_ranks = 0;
  in.eval_messages = layout.eval_messages;
  if (keep > 0) {  // a round: its trajectories' K + 1 states in fp32, written as one row
    in.message_bytes = (keep + 1) * layout.batch * lat[0] * lat[1] * lat[2] * lat[3] * 4;
  }
  const auto plan = plan::make_generate_plan(in);
  const auto count = count_generate(layout, ranks, in.message_bytes);
  auto speed = planned_speed(cfg, o, in, t, lat, ranks);
  // A round's trajectories run the whole teacher.steps each (guided: two forwards a step).
  if (speed && keep > 0) {
    speed->teacher_forwards = static_cast<double>(cfg.teacher.steps) * (cfg.objective().guided(cfg.keys()) ? 2 : 1);
  }
  if (o.json) {
    auto j = plan_json(plan);
    j["generate"] = {{"ranks", ranks}, {"streams", layout.students}, {"messages", count.messages}, {"keep", keep},
                     {"message_bytes", in.message_bytes}, {"cache_bytes", count.bytes},
                     {"busiest_rank_messages", count.busiest},
                     {"seconds", speed ? nlohmann::json(plan::generate_seconds(*speed, count.busiest)) : nlohmann::json()}};
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  print_generate_plan(cfg, o, t, in, plan, count, speed);
  return kExitOk;
}

}  // namespace

int run_plan(const std::vector<std::string>& args) {
  job::RunConfig cfg;
  OptionTable table("plan options (the same config file and keys as train)");
  cfg.bind(table);
  PlanOptions o;
  OptionTable own("plan's own options");
  o.bind(own);
  table.add(own);
  if (parse_options(args, table).help) {
    print_help("wan-distill plan [--config FILE] [--gpu-memory 180GiB] [--host-memory 2TiB] "
               "[--gpus-per-node 8] [--np N] [--cpu] [--latent C,F,H,W] [--preset NAME] [--json] "
               "[--generate [--students S] [--shard-positions P] [--keep all|K]]",
               "Prints each rank's predicted memory (teacher weights, streaming buffers, activations,\n"
               "transport buffers, student weights, gradients, optimizer state, framework overhead)\n"
               "for every teacher placement (gpu, cpu, stream, shard), which fit the budgets, and\n"
               "recommends one. Nothing is loaded: the teacher's config.json and safetensors headers\n"
               "and the data set's shapes are read when they exist (docs/placement.md). With\n"
               "--generate, the same for the ranks of `generate` with these keys (a whole teacher\n"
               "each), the cache's size on disk and its time (docs/teacher-cache.md).",
               table);
    return kExitOk;
  }
  cfg.validate();
  o.validate();
  if (o.generate) return plan_generate(cfg, o);
  WD_CHECK_AS(ConfigError, cfg.has_teacher(),
              "plan sizes the teacher and student ranks of a distillation; train.objective("
                  << cfg.train.objective << ") trains without a teacher, every rank a student: its memory is "
                  "a student rank's in any placement's plan of the same student keys with train.objective velocity");
  WD_CHECK_AS(ConfigError, !cfg.from_cache(),
              "plan sizes the teacher and student ranks of a distillation; with data.teacher_cache("
                  << cfg.data.teacher_cache << ") every rank is a student reading the cache: its memory is a "
                  "student rank's in the plan of the same keys without data.teacher_cache (plan does not count "
                  "a cache's students yet, docs/teacher-cache.md#not-yet; `plan --generate` counts generate's ranks)");
  init_logging(Topology::single_process(), cfg.log.level);
  const auto t = planned_teacher(cfg, o);
  // The same checks `train` makes once it knows the teacher.
  ConfigProblems with_teacher;
  job::validate_with_teacher(cfg, t.config, teacher::stages_for(cfg.teacher, plan::Placement::kShard), with_teacher);
  with_teacher.throw_if_any("plan");
  const auto [lat, context_len] = planned_latent(cfg, o, t.config);
  const int world = o.np > 0 ? o.np : (o.cpu ? cfg.teacher.ranks * 3 : o.gpus_per_node);
  const auto layout = comm::Layout::make(world, cfg.teacher.ranks);
  const auto in = job::make_plan_input(cfg, plan_context(t, lat, context_len, world, o));
  const auto plan = plan::make_plan(in);
  const auto speed = planned_speed(cfg, o, in, t, lat, world);
  const auto layouts = speed ? plan::predict_layouts(*speed) : std::vector<plan::LayoutSpeed>{};
  // data.teacher_cache_write: the cache the teacher ranks write as they stream, generate's layout
  // for these students (no memory beyond the message being written; its size on disk). A held-out
  // set the global batch does not divide, which train refuses, gets no line (cache_layout throws).
  std::optional<GenerateCount> written;
  const int streams = job::cache_streams(cfg, layout);  // a student's, or a sequence-parallel group's each
  if (cfg.writes_cache() && streams >= 1 && cfg.train.eval_samples % (cfg.train.batch_size * streams) == 0) {
    written = count_generate(job::cache_layout(cfg, streams, cfg.data.teacher_cache_shard_positions), 1,
                             in.message_bytes);
  }
  if (o.json) {
    auto j = plan_json(plan);
    j["speed"] = speed ? speed_json(*speed, layouts) : nlohmann::json();
    if (written) j["teacher_cache_write"] = {{"messages", written->messages}, {"cache_bytes", written->bytes}};
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  print_plan(cfg, o, t, in, plan, speed, layouts, layout, lat);
  if (written) {
    std::cout << "data.teacher_cache_write: " << written->messages << " messages x "
              << format_bytes(static_cast<double>(in.message_bytes)) << " = "
              << format_bytes(static_cast<double>(written->bytes))
              << " on disk, written by the teacher ranks between their forwards (the shards' HDF5 headers and "
                 "checksums add a few KiB each)\n";
  }
  return kExitOk;
}

}  // namespace wd::app
