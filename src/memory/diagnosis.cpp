// The failure diagnosis: memory table by category, remedies from config and numbers, and the
// adjusted command line.
#include "memory/diagnosis.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/logging.hpp"

namespace wd::memory {

namespace {

std::string bytes(std::uint64_t n) { return format_bytes(static_cast<double>(n)); }

/// Share of a rank's peak its activations must reach for checkpointing or a smaller batch to be
/// offered (unless they free the failed request whole).
constexpr double kActivationShareWorthRemedies = 0.10;

std::string number(double v) { return fmt::format("{:g}", v); }

/// The bytes the failure happened against: the device when there is one, else host RSS.
std::uint64_t peak_of(const MemoryReport& r) {
  if (r.device.available) return std::max(r.device.peak_reserved_bytes, r.device.reserved_bytes);
  return std::max(r.peak_rss_bytes, r.rss_bytes);
}

std::string quote(const std::string& word) {
  if (!word.empty() && word.find_first_of(" \t\"'$\\;&|<>()*?[]{}") == std::string::npos) return word;
  std::string out = "'";
  for (const char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string rank_label(int rank, Role role) { return fmt::format("rank {} ({})", rank, role_name(role)); }

const RankFailureState* failed_state(const DiagnosisInput& in) {
  return in.failed_rank >= 0 && in.failed_rank < static_cast<int>(in.ranks.size()) ? &in.ranks[in.failed_rank]
                                                                                     : nullptr;
}

/// All the memory the failed allocation could have come from: the device's, else the host's.
/// {0, ""} when the rank did not report it.
std::pair<std::uint64_t, const char*> memory_in_all(const MemoryReport& r) {
  if (r.device.available) return {r.device.total_bytes, "GPU memory"};
  return {r.host_total_bytes, "host memory"};
}

/// An out-of-memory whose request exceeds all the memory of the rank's device (or host): no
/// budget fits it, so it is a wrong shape. {request, memory in all, its kind} when it is one.
struct ImpossibleRequest {
  std::uint64_t request = 0, total = 0;
  const char* where = "";
};
std::optional<ImpossibleRequest> impossible_request(const DiagnosisInput& in) {
  const auto request = requested_bytes(in.message);
  const auto* failed = failed_state(in);
  if (!request || !failed || !failed->answered) return std::nullopt;
  const auto [total, where] = memory_in_all(failed->memory);
  if (total == 0 || *request <= total) return std::nullopt;
  return ImpossibleRequest{*request, total, where};
}

/// What the OOM remedies read of the failure: the failed rank's peak and its transient share.
struct OomFacts {
  const RemedyContext& ctx;
  const RankFailureState* failed = nullptr;
  bool known = false;  ///< the failed rank's memory report arrived
  std::uint64_t peak = 0, transient = 0;
  double share = 0;    ///< transient / peak
  std::optional<std::uint64_t> request;  ///< the failed allocation, when the message names it
  /// Checkpointing and a smaller batch free activations: worth offering where activations are a
  /// real part of the rank's memory, or at least the size of the failed request. With activations
  /// at 1% of the peak they would send the user the wrong way.
  bool activations_matter = false;
  std::string who;
  /// Whether `held` bytes are worth a remedy that frees all but 1/n of them.
  bool worth(std::uint64_t held, std::uint64_t n) const {
    return held > 0 && (held >= peak / 10 || (request && held - held / n >= *request));
  }
};

/// One remedy of one role: appends its advice when it applies.
using OomRule = void (*)(const OomFacts& f, std::vector<Remedy>& out);

void student_checkpointing(const OomFacts& f, std::vector<Remedy>& out) {
  if (f.ctx.checkpointing.mode == CheckpointPolicy::Mode::kAll || !f.activations_matter) return;
  out.push_back({fmt::format("activations are {:.0f}% of {}'s peak ({} of {}): --student.checkpointing all "
                             "recomputes each block in the backward (measured: 80% less activation "
                             "memory for 29% more step time, bench/results/checkpointing.md)",
                             100 * f.share, f.who, bytes(f.transient), bytes(f.peak)),
                 {{"student.checkpointing", "all"}}});
}

/// Groups of student ranks that share each sample, each rank holding its share of the tokens
/// through every block: the activations fall by the group's size; the accumulation grows by as
/// much, so the global batch stays.
void student_sequence_parallel(const OomFacts& f, std::vector<Remedy>& out) {
  if (!f.activations_matter) return;
  // A multiple of today's size: the accumulation then keeps the global batch exactly.
  const auto now = std::max<std::int64_t>(1, f.ctx.sequence_parallel);
  const auto& sizes = f.ctx.sequence_parallel_sizes;
  const auto it = std::find_if(sizes.begin(), sizes.end(), [&](std::int64_t g) { return g > now && g % now == 0; });
  if (it == sizes.end()) return;
  const auto g = *it;
  const auto ratio = static_cast<std::uint64_t>(g / now);
  const auto accum = f.ctx.grad_accum * static_cast<std::int64_t>(ratio);
  out.push_back({fmt::format("activations are {:.0f}% of {}'s peak ({} of {}): --student.sequence_parallel {} splits "
                             "every sample's tokens over groups of {} student ranks (about {} of activations a rank; "
                             "the same loss curve, docs/sequence-parallel.md); the groups train 1/{} as many batches "
                             "a step, so --train.grad_accum {} keeps the global batch",
                             100 * f.share, f.who, bytes(f.transient), bytes(f.peak), g, g,
                             bytes(f.transient / ratio), ratio, accum),
                 {{"student.sequence_parallel", std::to_string(g)}, {"train.grad_accum", std::to_string(accum)}}});
}

/// Half the batch per student with twice the accumulation (the same global batch), advised in `text`
/// ({} the batch, the half, the accumulation); none when activations do not matter or the batch is 1.
void halved_batch(const OomFacts& f, const std::string& text, std::vector<Remedy>& out) {
  if (f.ctx.batch_size <= 1 || !f.activations_matter) return;
  const auto half = f.ctx.batch_size / 2;
  const auto accum = f.ctx.grad_accum * (f.ctx.batch_size / half);
  out.push_back({fmt::format(fmt::runtime(text), f.ctx.batch_size, half, accum),
                 {{"train.batch_size", std::to_string(half)}, {"train.grad_accum", std::to_string(accum)}}});
}

void student_batch(const OomFacts& f, std::vector<Remedy>& out) {
  halved_batch(f,
               "batch {0} -> {1} per student frees about " + bytes(f.transient / 2) + " of activations on " + f.who +
                   "; --train.grad_accum {2} keeps the global batch and the results",
               out);
}

/// The AdamW moments and gradients: with several students, each can keep a 1/N slice of both
/// (student.shard gradients; optimizer already splits the moments).
void student_shard_gradients(const OomFacts& f, std::vector<Remedy>& out) {
  const std::uint64_t moments = f.known ? f.failed->memory.model.optimizer_state_bytes : 0;
  const std::uint64_t grads = f.known ? f.failed->memory.model.grads_bytes : 0;
  const bool whole_moments = f.ctx.student_shard == ShardMode::kNone;
  const std::uint64_t held = (whole_moments ? moments : 0) + grads;
  const auto n = static_cast<std::uint64_t>(std::max(1, f.ctx.student_ranks));
  const bool scattered = f.ctx.student_shard == ShardMode::kGradients || f.ctx.student_shard == ShardMode::kParameters;
  if (scattered || n <= 1 || !f.worth(held, n)) return;
  const auto what = whole_moments ? fmt::format("{} of AdamW moments and {} of gradients", bytes(moments), bytes(grads))
                                  : fmt::format("{} of gradients", bytes(grads));
  out.push_back({fmt::format("{} holds {}: --student.shard gradients keeps 1/{} of {} on each student ({}; the "
                             "same loss curve, docs/training.md), freeing {}",
                             f.who, what, n, whole_moments ? "both" : "them", bytes(held / n), bytes(held - held / n)),
                 {{"student.shard", "gradients"}}});
}

/// The weights: a host student of fp32 weights can keep a 1/N slice of the blocks' too
/// (student.shard parameters, which recomputes every block to gather it again).
void student_shard_parameters(const OomFacts& f, std::vector<Remedy>& out) {
  const std::uint64_t weights = f.known ? f.failed->memory.model.weights_bytes : 0;
  const bool host = f.known && !f.failed->memory.device.available;
  const auto n = static_cast<std::uint64_t>(std::max(1, f.ctx.student_ranks));
  if (!host || f.ctx.student_shard == ShardMode::kParameters || f.ctx.precision != Precision::kFp32 || n <= 1 || !f.worth(weights, n)) {
    return;
  }
  Remedy r{fmt::format("{} holds {} of weights: --student.shard parameters keeps a 1/{} slice of them on each "
                       "student (gradients and AdamW moments too) and gathers each block for its use (the same "
                       "loss curve, docs/training.md), freeing about {}",
                       f.who, bytes(weights), n, bytes(weights - weights / n)),
           {{"student.shard", "parameters"}}};
  if (f.ctx.checkpointing.mode != CheckpointPolicy::Mode::kAll) r.changes.emplace_back("student.checkpointing", "all");
  out.push_back(std::move(r));
}

/// A LoRA pair's two frozen bases: one job per expert holds one.
void student_one_expert(const OomFacts& f, std::vector<Remedy>& out) {
  const std::uint64_t bases = f.known ? f.failed->memory.teacher_weights_bytes : 0;
  if (!f.ctx.lora_pair || !(bases >= f.peak / 10 || (f.request && bases / 2 >= *f.request))) return;
  out.push_back({fmt::format("{} holds the LoRA pair's two frozen expert bases ({}): --student.expert high, then "
                             "a second job with --student.expert low, trains one expert's adapters per job over "
                             "its base alone (docs/lora.md#two-expert-teachers), freeing {}",
                             f.who, bytes(bases), bytes(bases / 2)),
                 {{"student.expert", "high"}}});
}

void student_bf16(const OomFacts& f, std::vector<Remedy>& out) {
  if (f.ctx.precision != Precision::kFp32 || f.share < 0.3) return;
  out.push_back({fmt::format("--student.precision bf16-mixed computes in bf16: about half of the {} "
                             "of activations on {}, at the cost of a bf16 copy of the weights ({})",
                             bytes(f.transient), f.who, bytes(f.known ? f.failed->memory.model.weights_bytes / 2 : 0)),
                 {{"student.precision", "bf16-mixed"}}});
}

std::uint64_t teacher_weights(const OomFacts& f) { return f.known ? f.failed->memory.teacher_weights_bytes : 0; }

void teacher_bf16(const OomFacts& f, std::vector<Remedy>& out) {
  if (f.ctx.teacher_dtype != DtypeChoice::kFp32) return;
  out.push_back({fmt::format("{} holds {} of fp32 teacher weights: --teacher.dtype bf16 frees {}", f.who,
                             bytes(teacher_weights(f)), bytes(teacher_weights(f) / 2)),
                 {{"teacher.dtype", "bf16"}}});
}

/// Where the weights live: fewer of them on the rank that ran out.
void teacher_stream(const OomFacts& f, std::vector<Remedy>& out) {
  if (f.ctx.teacher_placement == TeacherPlacement::kGpu) {
    out.push_back({fmt::format("{} holds all {} of teacher weights on its GPU: --teacher.placement stream keeps "
                               "them in host memory and holds {} blocks on the device",
                               f.who, bytes(teacher_weights(f)), f.ctx.stream_ahead + 1),
                   {{"teacher.placement", "stream"}}});
  }
  if (f.ctx.teacher_placement == TeacherPlacement::kStream && f.ctx.stream_ahead > 1) {
    out.push_back({fmt::format("--teacher.stream_ahead 1 keeps 2 block buffers on {} instead of {}", f.who,
                               f.ctx.stream_ahead + 1),
                   {{"teacher.stream_ahead", "1"}}});
  }
}

void teacher_shard(const OomFacts& f, std::vector<Remedy>& out) {
  const auto& ctx = f.ctx;
  if (ctx.teacher_ranks <= ctx.teacher_stages || ctx.teacher_placement == TeacherPlacement::kStream) return;
  const auto weights = teacher_weights(f);
  out.push_back({fmt::format("--teacher.placement shard --teacher.stages {} splits the blocks over all {} teacher "
                             "ranks: about {} of weights per rank instead of {}",
                             ctx.teacher_ranks, ctx.teacher_ranks,
                             bytes(weights * static_cast<std::uint64_t>(ctx.teacher_stages) /
                                   static_cast<std::uint64_t>(ctx.teacher_ranks)),
                             bytes(weights)),
                 {{"teacher.placement", "shard"}, {"teacher.stages", std::to_string(ctx.teacher_ranks)}}});
}

void teacher_batch(const OomFacts& f, std::vector<Remedy>& out) {
  halved_batch(f,
               "the teacher's forward holds " + bytes(f.transient) + " of activations for a batch of {0} per "
               "student; batch {0} -> {1} with --train.grad_accum {2} halves them and keeps the global batch",
               out);
}

/// Each role's remedies, in the order the diagnosis offers them.
const std::vector<OomRule> kStudentRules{student_checkpointing,    student_batch,      student_sequence_parallel,
                                         student_shard_gradients,  student_shard_parameters, student_one_expert,
                                         student_bf16};
const std::vector<OomRule> kTeacherRules{teacher_bf16, teacher_stream, teacher_shard, teacher_batch};

void out_of_memory_remedies(const DiagnosisInput& in, std::vector<Remedy>& out) {
  if (const auto impossible = impossible_request(in)) {
    // No batch size, checkpointing or placement makes one tensor larger than the memory fit:
    // memory remedies would only send the user the wrong way.
    out.push_back({fmt::format("the failed request was {}, more than all the {} of {} ({}): a wrong shape, not a "
                               "memory budget problem. A tensor that size comes from a dimension read from a bad "
                               "config.json or data file, or a product of dimensions that overflowed: check the "
                               "shapes reaching the op in the error (`wan-distill inspect` for the checkpoint, "
                               "the data set's /latents and /context shapes); no memory setting of this job helps",
                               bytes(impossible->request), impossible->where, rank_label(in.failed_rank, in.failed_role),
                               bytes(impossible->total)),
                   {}});
    return;
  }
  OomFacts f{in.context};
  f.failed = failed_state(in);
  f.known = f.failed && f.failed->answered;
  f.peak = f.known ? peak_of(f.failed->memory) : 0;
  f.transient = f.known ? transient_bytes(f.failed->memory) : 0;
  f.share = f.peak > 0 ? static_cast<double>(f.transient) / static_cast<double>(f.peak) : 0.0;
  f.who = rank_label(in.failed_rank, in.failed_role);
  f.request = requested_bytes(in.message);
  f.activations_matter = !f.known || f.share >= kActivationShareWorthRemedies || (f.request && f.transient >= *f.request);
  for (const auto rule : in.failed_role == Role::kStudent ? kStudentRules : kTeacherRules) rule(f, out);
  if (!out.empty()) return;
  const auto why =
      f.activations_matter
          ? fmt::format("batch {} per student, checkpointing {}", f.ctx.batch_size, f.ctx.checkpointing.str())
          : fmt::format("its activations are {}, {:.1f}% of its {} peak{}: checkpointing or a smaller batch frees "
                        "too little to matter",
                        bytes(f.transient), std::floor(1000 * f.share) / 10, bytes(f.peak),
                        f.request ? ", against a failed request of " + bytes(*f.request) : std::string());
  out.push_back({fmt::format("no setting of this job frees memory on {} ({}); give the job ranks with more memory "
                             "or a smaller student",
                             f.who, why),
                 {}});
}

void numerical_remedies(const DiagnosisInput& in, std::vector<Remedy>& out) {
  const auto& ctx = in.context;
  if (in.failed_role == Role::kTeacher) {
    if (ctx.teacher_dtype == DtypeChoice::kFp16) {
      out.push_back({"fp16 overflows in the Wan DiT's activations: --teacher.dtype bf16 has fp32's range",
                     {{"teacher.dtype", "bf16"}}});
    }
    out.push_back({"the teacher's output is not finite: check the checkpoint (wan-distill inspect "
                   "<dir>) and the data set's latents and text features for NaN/Inf",
                   {}});
    return;
  }
  out.push_back({fmt::format("the loss diverged: --train.lr {} -> {}", number(ctx.lr), number(ctx.lr / 2)),
                 {{"train.lr", number(ctx.lr / 2)}}});
  if (ctx.grad_clip <= 0) {
    out.push_back({"clip the gradient norm: --train.grad_clip 1.0 (now off)", {{"train.grad_clip", "1.0"}}});
  }
  if (ctx.precision == Precision::kBf16Mixed) {
    out.push_back({"compute in fp32 to rule out bf16 range problems: --student.precision fp32",
                   {{"student.precision", "fp32"}}});
  }
}

}  // namespace

std::optional<std::uint64_t> requested_bytes(const std::string& message) {
  std::string text = message;
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  const std::string key = "tried to allocate ";
  const auto at = text.find(key);
  if (at == std::string::npos) return std::nullopt;
  const char* begin = text.c_str() + at + key.size();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  if (end == begin || !(value >= 0)) return std::nullopt;
  auto pos = static_cast<std::size_t>(end - text.c_str());
  while (pos < text.size() && text[pos] == ' ') ++pos;
  auto stop = pos;
  while (stop < text.size() && std::isalpha(static_cast<unsigned char>(text[stop]))) ++stop;
  const auto unit = text.substr(pos, stop - pos);
  static const std::pair<const char*, double> kUnits[] = {
      {"bytes", 1.0}, {"b", 1.0}, {"kib", 0x1p10}, {"mib", 0x1p20}, {"gib", 0x1p30}, {"tib", 0x1p40}, {"pib", 0x1p50}};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name) return static_cast<std::uint64_t>(value * scale);
  }
  return std::nullopt;
}

std::uint64_t transient_bytes(const MemoryReport& r) {
  if (r.device.available) {
    return r.device.peak_allocated_bytes > r.device.allocated_bytes
               ? r.device.peak_allocated_bytes - r.device.allocated_bytes
               : 0;
  }
  return r.peak_rss_bytes > r.rss_bytes ? r.peak_rss_bytes - r.rss_bytes : 0;
}

std::vector<Remedy> compute_remedies(const DiagnosisInput& in) {
  std::vector<Remedy> out;
  const auto& ctx = in.context;
  switch (in.kind) {
    case FailureKind::kOutOfMemory:
      out_of_memory_remedies(in, out);
      break;
    case FailureKind::kNumerical:
      numerical_remedies(in, out);
      break;
    case FailureKind::kPeerLost: {
      std::string ranks;
      for (const int r : in.lost) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      out.push_back({fmt::format("rank(s) {} stopped answering: read their last log lines, and the kernel log "
                                 "(`dmesg | grep -i -e oom -e killed`) on their node for the OOM killer",
                                 ranks.empty() ? "?" : ranks),
                     {}});
      out.push_back({fmt::format("if one step legitimately takes longer than {} s (a large teacher on few GPUs), "
                                 "raise the deadline: --comm.timeout_s {}",
                                 number(ctx.timeout_s), number(ctx.timeout_s * 2)),
                     {{"comm.timeout_s", number(ctx.timeout_s * 2)}}});
      break;
    }
    case FailureKind::kInterrupted:
      if (!ctx.resume_hint.empty()) {
        out.push_back({"resume from the newest checkpoint (" + ctx.resume_hint + "): --resume auto", {{"resume", "auto"}}});
      } else {
        out.push_back({"the job was stopped by a signal before any checkpoint: set --checkpoint.every to keep "
                       "progress across stops",
                       {}});
      }
      break;
    case FailureKind::kData:
      out.push_back({"fix or replace the file named in the error (docs/data-format.md describes the schema; "
                     "`wan-distill inspect` checks checkpoints)",
                     {}});
      break;
    case FailureKind::kConfig:
      out.push_back({"correct the value named in the error (wan-distill train --help)", {}});
      break;
    default:
      out.push_back({"see the error above; the log of the failed rank has the lines before it", {}});
      break;
  }
  return out;
}

std::string adjusted_command(const std::vector<std::string>& args,
                             const std::vector<std::pair<std::string, std::string>>& changes) {
  std::vector<std::string> words = args;
  for (const auto& [key, value] : changes) {
    const std::string flag = "--" + key;
    bool done = false;
    for (std::size_t i = 0; i < words.size() && !done; ++i) {
      if (words[i] == flag && i + 1 < words.size()) {
        words[i + 1] = value;
        done = true;
      } else if (words[i].rfind(flag + "=", 0) == 0) {
        words[i] = flag + "=" + value;
        done = true;
      }
    }
    if (!done) {
      words.push_back(flag);
      words.push_back(value);
    }
  }
  std::string line = "wan-distill train";
  for (const auto& w : words) line += " " + quote(w);
  return line;
}

std::string format_diagnosis(const DiagnosisInput& in) {
  std::string text = "================ wan-distill train stopped: diagnosis ================\n";
  text += fmt::format("cause:   {} {} at step {} in {}\n", rank_label(in.failed_rank, in.failed_role),
                      failure_kind_name(in.kind), in.step, in.op.empty() ? "?" : in.op);
  text += "error:   " + in.message + "\n";
  if (in.kind == FailureKind::kOutOfMemory) {
    if (const auto request = requested_bytes(in.message)) {
      const auto* failed = failed_state(in);
      const auto [total, where] = failed && failed->answered ? memory_in_all(failed->memory)
                                                             : std::pair<std::uint64_t, const char*>{0, ""};
      text += "request: " + bytes(*request);
      if (total > 0) {
        text += fmt::format(" of {} {} in all{}", bytes(total), where,
                            *request > total ? ": more than there is, a wrong shape (see below)" : "");
      }
      text += "\n";
    }
  }
  if (!in.lost.empty()) {
    std::string ranks;
    for (const int r : in.lost) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    text += "stopped answering: rank(s) " + ranks + "\n";
  }
  for (const auto& line : in.other_notices) text += "also:    " + line + "\n";
  text += fmt::format("exit code {} ({}) on every rank\n\n", exit_code(in.kind), failure_kind_name(in.kind));

  text += "memory by rank (transient = the step's activations and temporaries: peak minus now)\n";
  text += fmt::format("  {:>4}  {:<7}  {:<22} {:>6}  {:<18} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}  {}\n",
                      "rank", "role", "state", "step", "op", "RSS", "peak RSS", "teacher W", "student W",
                      "grads", "optimizer", "transient", "transport", "device alloc/reserved/free/total");
  for (const auto& r : in.ranks) {
    std::string state = !r.answered                        ? "no answer"
                        : r.own == FailureKind::kPeerLost  ? "timed out waiting"
                        : r.own != FailureKind::kNone      ? std::string("FAILED: ") + failure_kind_name(r.own)
                                                           : "stopped";
    if (!r.answered) {
      text += fmt::format("  {:>4}  {:<7}  {:<22}\n", r.rank, role_name(r.role), state);
      continue;
    }
    const auto& m = r.memory;
    std::string device = "-";
    if (m.device.available) {
      device = bytes(m.device.allocated_bytes) + " / " + bytes(m.device.reserved_bytes) + " / " +
               bytes(m.device.free_bytes) + " / " + bytes(m.device.total_bytes);
    }
    text += fmt::format("  {:>4}  {:<7}  {:<22} {:>6}  {:<18} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}  {}\n",
                        r.rank, role_name(r.role), state, r.step, r.op.substr(0, 18), bytes(m.rss_bytes),
                        bytes(m.peak_rss_bytes), bytes(m.teacher_weights_bytes), bytes(m.model.weights_bytes),
                        bytes(m.model.grads_bytes), bytes(m.model.optimizer_state_bytes), bytes(transient_bytes(m)),
                        bytes(m.transport_bytes), device);
  }
  const auto remedies = compute_remedies(in);
  text += "\nwhat to change:\n";
  for (std::size_t i = 0; i < remedies.size(); ++i) text += fmt::format("  {}. {}\n", i + 1, remedies[i].text);
  for (const auto& remedy : remedies) {
    if (remedy.changes.empty()) continue;
    text += "\nadjusted command (remedy " + std::to_string(&remedy - remedies.data() + 1) + "):\n  " +
            adjusted_command(in.context.args, remedy.changes) + "\n";
    break;
  }
  text += "======================================================================";
  return text;
}

}  // namespace wd::memory
