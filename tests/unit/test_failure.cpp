// Failure kinds and exit codes, fault specs, and the diagnosis: remedies computed from the
// config and the memory numbers, and the adjusted command line.
#include <gtest/gtest.h>

#include <algorithm>

#include <map>
#include <new>
#include <optional>
#include <string>

#include "core/errors.hpp"
#include "core/failure.hpp"
#include "core/fault_injection.hpp"
#include "memory/diagnosis.hpp"
#include "test_util.hpp"

namespace wd::test_failure {
namespace {

template <typename E>
FailureKind kind_of(E error) {
  try {
    throw error;
  } catch (...) {
    return classify_failure(std::current_exception());
  }
}

TEST(Failure, EachKindHasItsDocumentedExitCode) {
  EXPECT_EQ(kind_of(ConfigError("x")), FailureKind::kConfig);
  EXPECT_EQ(kind_of(DataError("f", "i", "x")), FailureKind::kData);
  EXPECT_EQ(kind_of(std::bad_alloc()), FailureKind::kOutOfMemory);
  EXPECT_EQ(kind_of(NumericalError("nan")), FailureKind::kNumerical);
  EXPECT_EQ(kind_of(Error("x")), FailureKind::kError);
  EXPECT_EQ(exit_code(FailureKind::kOutOfMemory), 4);
  EXPECT_EQ(exit_code(FailureKind::kNumerical), 5);
  EXPECT_EQ(exit_code(FailureKind::kPeerLost), 6);
  EXPECT_EQ(exit_code(FailureKind::kInterrupted), 7);
  EXPECT_EQ(kExitRequeue, 75);
}

TEST(Failure, LibTorchsCpuAllocatorFailureIsOutOfMemory) {
  std::exception_ptr failure;
  try {
    auto t = torch::empty({std::int64_t{1} << 48}, torch::kUInt8);  // 256 TiB
  } catch (...) {
    failure = std::current_exception();
  }
  ASSERT_TRUE(failure);
  EXPECT_EQ(classify_failure(failure), FailureKind::kOutOfMemory) << failure_message(failure);
}

/// The kind of the c10::Error LibTorch's own checks raise with `text` (TORCH_CHECK, as
/// TORCH_CUDABLAS_CHECK and AT_CUDNN_CHECK do).
FailureKind kind_of_torch_check(const std::string& text) {
  try {
    TORCH_CHECK(false, text);
  } catch (...) {
    return classify_failure(std::current_exception());
  }
  return FailureKind::kNone;
}

// A device OOM reaches us through four libraries, each wording it its own way; every one must
// exit 4 with the memory diagnosis, not 1. The texts are the libraries' own (sources named).
TEST(Failure, DeviceAllocationFailuresOfEveryLibraryAreOutOfMemory) {
  // WD_CHECK_CUDA around cudaHostAlloc / cudaMalloc: CUDA's code 2, cudaErrorMemoryAllocation,
  // whose cudaGetErrorString is "out of memory".
  EXPECT_EQ(kind_of(CudaError("cudaHostAlloc(&staging, bytes, cudaHostAllocDefault) failed: out of memory "
                              "(cudaErrorMemoryAllocation) (rank 3, at cuda_copy_engine.cpp:84)",
                              2)),
            FailureKind::kOutOfMemory);
  // NCCL (src/include/checks.h CUDACHECK: WARN("Cuda failure '%s'"); cudawrap.h CUCHECK:
  // WARN("Cuda failure %d '%s'"); alloc.h: WARN("Failed to CUDA calloc async %ld bytes") and,
  // for host memory, WARN("Failed to malloc %ld bytes") with ncclSystemError), the last warning
  // appended by nccl_error_message to ncclGetErrorString's text.
  const std::string init = "ncclCommInitRankConfig failed: ";
  const std::string cuda = "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
  const std::string system = "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  for (const std::string& text :
       {init + cuda + " [Cuda failure 'out of memory'] (rank 1, at nccl_comm.cpp:153)",
        init + cuda + " [Cuda failure 2 'out of memory'] (rank 1, at nccl_comm.cpp:153)",
        init + cuda + " [Failed to CUDA calloc async 4 bytes] (rank 1, at nccl_comm.cpp:153)",
        init + cuda + " [Failed to CUDA malloc 33554432 bytes] (rank 1, at nccl_comm.cpp:153)",
        init + cuda + " [Failed to CUDA host alloc 8388608 bytes] (rank 1, at nccl_comm.cpp:153)",
        init + system + " [Failed to malloc 1048576 bytes] (rank 1, at nccl_comm.cpp:153)"}) {
    EXPECT_EQ(kind_of(NcclError(text)), FailureKind::kOutOfMemory) << text;
  }
  // PyTorch's TORCH_CUDABLAS_CHECK ("CUDA error: ", _cublasGetErrorEnum(status), " when calling
  // `" #EXPR "`", aten/src/ATen/cuda/Exceptions.h) and AT_CUDNN_CHECK ("cuDNN error: ",
  // cudnnGetErrorString(status)).
  EXPECT_EQ(kind_of_torch_check("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
            FailureKind::kOutOfMemory);
  EXPECT_EQ(kind_of_torch_check("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), FailureKind::kOutOfMemory);
  EXPECT_EQ(exit_code(kind_of(CudaError("x", CudaError::kMemoryAllocation))), 4);
}

TEST(Failure, OtherDeviceFailuresStayErrors) {
  // cudaErrorIllegalAddress (700), and a CudaError without a CUDA code (no device visible).
  EXPECT_EQ(kind_of(CudaError("cudaStreamQuery(stream) failed: an illegal memory access was encountered "
                              "(cudaErrorIllegalAddress) (rank 0, at nccl_comm.cpp:239)",
                              700)),
            FailureKind::kError);
  EXPECT_EQ(kind_of(CudaError("NCCL transport: no CUDA device visible on rank 0")), FailureKind::kError);
  // The code decides, not the words: an illegal address is no OOM whatever the message says.
  EXPECT_EQ(kind_of(CudaError("out of memory", 700)), FailureKind::kError);
  EXPECT_EQ(kind_of(NcclError("ncclCommGetAsyncError failed: remote process exited or there was a network error "
                              "(rank 2, at nccl_comm.cpp:215) during gradient all-reduce of step 7")),
            FailureKind::kError);
  EXPECT_EQ(kind_of(NcclError("ncclCommInitRankConfig failed: " + std::string("unhandled cuda error (run with "
                              "NCCL_DEBUG=INFO for details) [Cuda failure 'invalid device ordinal']"))),
            FailureKind::kError);
  EXPECT_EQ(kind_of_torch_check("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx(handle, "
                                "opa, opb, m, n, k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, c, "
                                "CUDA_R_16BF, ldc, CUDA_R_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP)`"),
            FailureKind::kError);
  EXPECT_EQ(kind_of_torch_check("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED"), FailureKind::kError);
}

TEST(FaultSpec, ParsesTheDocumentedFormAndRejectsEverythingElse) {
  const auto spec = FaultSpec::parse("oom@student:1:3");
  ASSERT_TRUE(spec);
  EXPECT_EQ(spec->kind, FaultSpec::Kind::kOom);
  EXPECT_EQ(spec->role, Role::kStudent);
  EXPECT_EQ(spec->role_rank, 1);
  EXPECT_EQ(spec->step, 3);
  EXPECT_EQ(spec->describe(), "oom@student:1:3");
  EXPECT_EQ(spec->point, FaultSpec::Point::kStep);  // the old form: the step's start
  EXPECT_EQ(spec->describe(), "oom@student:1:3");
  EXPECT_EQ(FaultSpec::parse("oom_huge@teacher:0:2")->kind, FaultSpec::Kind::kOomHuge);
  EXPECT_FALSE(FaultSpec::parse(""));
  for (const char* bad : {"oom", "boom@student:0:1", "oom@pupil:0:1", "oom@student:x:1", "oom@student:0:0",
                          "oom@student:0", "oom@student:-1:2"}) {
    try {
      FaultSpec::parse(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_TRUE(test::contains(e.what(), std::string("inject-fault(") + bad + ")")) << e.what();
      EXPECT_TRUE(test::contains(e.what(), "KIND@ROLE:RANK:STEP[:POINT]")) << e.what();
    }
  }
}

TEST(FaultSpec, APointPlacesTheFaultInsideTheStep) {
  const std::map<std::string, FaultSpec::Point> good{{"sigkill@student:1:3:allreduce", FaultSpec::Point::kAllreduce},
                                                     {"hang@teacher:0:2:send", FaultSpec::Point::kSend},
                                                     {"sigkill@student:0:4:save", FaultSpec::Point::kSave},
                                                     {"throw@teacher:1:5:step", FaultSpec::Point::kStep}};
  for (const auto& [text, point] : good) {
    const auto spec = FaultSpec::parse(text);
    ASSERT_TRUE(spec) << text;
    EXPECT_EQ(spec->point, point) << text;
  }
  EXPECT_EQ(FaultSpec::parse("sigkill@student:1:3:allreduce")->describe(), "sigkill@student:1:3:allreduce");
  EXPECT_EQ(FaultSpec::parse("sigkill@student:1:3:allreduce")->step, 3);
  EXPECT_EQ(FaultSpec::parse("throw@teacher:1:5:step")->describe(), "throw@teacher:1:5");
  // Each refusal names the option, the text, what is wrong with it and the expected form.
  const std::map<std::string, std::string> bad{
      {"sigkill@student:0:3:flush", "unknown point 'flush'"},
      {"sigkill@student:0:3:", "unknown point ''"},
      {"sigkill@student:0:3:save:now", "unknown point 'save:now'"},
      {"sigkill@student:0:x:save", "not a number"},
      {"sigkill@teacher:0:3:allreduce", "only students reach"},
      {"sigkill@teacher:0:3:save", "only students reach"},
      {"sigkill@student:0:3:send", "only teachers reach"},
      {"sigkill@student:1:3:save", "student 0 writes every checkpoint"},
      {"nan@student:0:3:allreduce", "strikes only at the step's start"}};
  for (const auto& [text, why] : bad) {
    try {
      FaultSpec::parse(text);
      ADD_FAILURE() << text << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_TRUE(test::contains(e.what(), "inject-fault(" + text + ") ")) << e.what();
      EXPECT_TRUE(test::contains(e.what(), why)) << e.what();
      EXPECT_TRUE(test::contains(e.what(), "KIND@ROLE:RANK:STEP[:POINT]")) << e.what();
    }
  }
}

TEST(FaultInjector, FiresOnlyOnItsRankAndStep) {
  const FaultInjector mine(FaultSpec::parse("throw@student:1:3"), Role::kStudent, 1);
  const FaultInjector other(FaultSpec::parse("throw@student:1:3"), Role::kStudent, 0);
  EXPECT_NO_THROW(mine.at_step(2, torch::kCPU));
  EXPECT_NO_THROW(other.at_step(3, torch::kCPU));
  EXPECT_THROW(mine.at_step(3, torch::kCPU), Error);
  const FaultInjector oom(FaultSpec::parse("oom@teacher:0:1"), Role::kTeacher, 0);
  try {
    oom.at_step(1, torch::kCPU);
    ADD_FAILURE() << "no allocation failure";
  } catch (...) {
    EXPECT_EQ(classify_failure(std::current_exception()), FailureKind::kOutOfMemory);
  }
  const FaultInjector nan(FaultSpec::parse("nan@student:0:4"), Role::kStudent, 0);
  EXPECT_TRUE(nan.nan_due(4));
  EXPECT_FALSE(nan.nan_due(3));
}

TEST(FaultInjector, FiresOnlyAtItsPoint) {
  using Point = FaultSpec::Point;
  const FaultInjector mine(FaultSpec::parse("throw@student:1:3:allreduce"), Role::kStudent, 1);
  const FaultInjector other(FaultSpec::parse("throw@student:1:3:allreduce"), Role::kStudent, 0);
  EXPECT_TRUE(mine.planned(Point::kAllreduce));
  EXPECT_FALSE(mine.planned(Point::kStep));
  EXPECT_FALSE(mine.planned(Point::kSave));
  EXPECT_FALSE(other.planned(Point::kAllreduce));
  EXPECT_NO_THROW(mine.at_step(3, torch::kCPU));  // the step's start is another point
  EXPECT_NO_THROW(mine.at(Point::kSave, 3, torch::kCPU));
  EXPECT_NO_THROW(mine.at(Point::kAllreduce, 2, torch::kCPU));
  EXPECT_NO_THROW(other.at(Point::kAllreduce, 3, torch::kCPU));
  EXPECT_THROW(mine.at(Point::kAllreduce, 3, torch::kCPU), Error);
  const FaultInjector plain(FaultSpec::parse("throw@teacher:0:2"), Role::kTeacher, 0);
  EXPECT_NO_THROW(plain.at(Point::kSend, 2, torch::kCPU));
  EXPECT_THROW(plain.at_step(2, torch::kCPU), Error);
}

constexpr std::uint64_t kMiB = 1024 * 1024;

memory::DiagnosisInput student_oom() {
  memory::DiagnosisInput in;
  in.kind = FailureKind::kOutOfMemory;
  in.failed_rank = 3;
  in.failed_role = Role::kStudent;
  in.step = 12;
  in.op = "train step";
  in.message = "CUDA out of memory";
  in.ranks.resize(4);
  for (int r = 0; r < 4; ++r) {
    auto& s = in.ranks[r];
    s.rank = r;
    s.role = r == 0 ? Role::kTeacher : Role::kStudent;
    s.answered = true;
    s.memory.rss_bytes = 1000 * kMiB;
    s.memory.peak_rss_bytes = 1000 * kMiB;
  }
  // Rank 3: 1000 MiB now, 2500 MiB at its peak: 1500 MiB (60%) were the step's activations.
  in.ranks[3].own = FailureKind::kOutOfMemory;
  in.ranks[3].memory.peak_rss_bytes = 2500 * kMiB;
  in.ranks[3].memory.model.weights_bytes = 400 * kMiB;
  in.context.checkpointing = CheckpointPolicy::parse("off");
  in.context.batch_size = 8;
  in.context.grad_accum = 1;
  in.context.args = {"--config", "job.ini", "--train.batch_size", "8"};
  return in;
}

TEST(Diagnosis, OutOfMemoryRemediesUseTheRanksNumbers) {
  const auto in = student_oom();
  EXPECT_EQ(memory::transient_bytes(in.ranks[3].memory), 1500 * kMiB);
  const auto remedies = memory::compute_remedies(in);
  ASSERT_GE(remedies.size(), 3u);
  EXPECT_TRUE(test::contains(remedies[0].text, "activations are 60% of rank 3 (student)'s peak")) << remedies[0].text;
  EXPECT_EQ(remedies[0].changes, (std::vector<std::pair<std::string, std::string>>{{"student.checkpointing", "all"}}));
  EXPECT_TRUE(test::contains(remedies[1].text, "batch 8 -> 4 per student frees about 750.00 MiB")) << remedies[1].text;
  EXPECT_TRUE(test::contains(remedies[1].text, "--train.grad_accum 2 keeps the global batch")) << remedies[1].text;
  EXPECT_TRUE(test::contains(remedies[2].text, "bf16-mixed")) << remedies[2].text;

  const auto text = memory::format_diagnosis(in);
  EXPECT_TRUE(test::contains(text, "cause:   rank 3 (student) out of memory at step 12 in train step")) << text;
  EXPECT_TRUE(test::contains(text, "FAILED: out of memory")) << text;
  EXPECT_TRUE(test::contains(text, "exit code 4 (out of memory) on every rank")) << text;
  EXPECT_TRUE(test::contains(text, "wan-distill train --config job.ini --train.batch_size 8 --student.checkpointing all"))
      << text;
}

// A job whose samples can be split (student.sequence_parallel sizes that fit it): the diagnosis
// offers the smallest, with the accumulation that keeps the global batch.
TEST(Diagnosis, ActivationsOfOneSampleAreOfferedSequenceParallelism) {
  auto in = student_oom();
  in.context.checkpointing = CheckpointPolicy::parse("all");
  in.context.batch_size = 1;
  in.context.grad_accum = 3;
  in.context.sequence_parallel_sizes = {2, 4};
  const auto remedies = memory::compute_remedies(in);
  ASSERT_GE(remedies.size(), 1u);
  EXPECT_TRUE(test::contains(remedies[0].text, "--student.sequence_parallel 2 splits every sample's tokens over groups "
                                               "of 2 student ranks (about 750.00 MiB of activations a rank"))
      << remedies[0].text;
  EXPECT_EQ(remedies[0].changes, (std::vector<std::pair<std::string, std::string>>{{"student.sequence_parallel", "2"},
                                                                                  {"train.grad_accum", "6"}}));
  // Already in groups of 2: the next size, 4, halves again.
  in.context.sequence_parallel = 2;
  in.context.sequence_parallel_sizes = {5, 4};  // 2 -> 5 would not keep the global batch whole
  const auto next = memory::compute_remedies(in);
  EXPECT_TRUE(test::contains(next[0].text, "--student.sequence_parallel 4")) << next[0].text;
  EXPECT_EQ(next[0].changes.back(), (std::pair<std::string, std::string>{"train.grad_accum", "6"}));
}

TEST(Diagnosis, RemediesFollowTheConfig) {
  auto in = student_oom();
  in.context.checkpointing = CheckpointPolicy::parse("all");
  in.context.batch_size = 1;
  in.context.precision = Precision::kBf16Mixed;
  const auto none = memory::compute_remedies(in);
  ASSERT_EQ(none.size(), 1u);
  EXPECT_TRUE(test::contains(none[0].text, "no setting of this job frees memory")) << none[0].text;

  in.failed_rank = 0;
  in.failed_role = Role::kTeacher;
  in.ranks[0].memory.teacher_weights_bytes = 2000 * kMiB;
  in.context.teacher_dtype = DtypeChoice::kFp32;
  const auto teacher = memory::compute_remedies(in);
  EXPECT_TRUE(test::contains(teacher[0].text, "--teacher.dtype bf16 frees 1000.00 MiB")) << teacher[0].text;

  // Placements: a GPU-resident teacher is offered streaming, two replicas a 2-stage shard.
  in.context.teacher_dtype = DtypeChoice::kBf16;
  in.context.teacher_placement = TeacherPlacement::kGpu;
  in.context.teacher_ranks = 2;
  const auto placed = memory::compute_remedies(in);
  ASSERT_GE(placed.size(), 2u);
  EXPECT_TRUE(test::contains(placed[0].text, "--teacher.placement stream keeps them in host memory and holds 3 blocks"))
      << placed[0].text;
  EXPECT_EQ(placed[0].changes, (std::vector<std::pair<std::string, std::string>>{{"teacher.placement", "stream"}}));
  EXPECT_TRUE(test::contains(placed[1].text, "about 1000.00 MiB of weights per rank instead of 1.95 GiB"))
      << placed[1].text;
  EXPECT_EQ(placed[1].changes, (std::vector<std::pair<std::string, std::string>>{{"teacher.placement", "shard"},
                                                                                  {"teacher.stages", "2"}}));
  in.context.teacher_placement = TeacherPlacement::kStream;
  EXPECT_EQ(memory::compute_remedies(in)[0].changes,
            (std::vector<std::pair<std::string, std::string>>{{"teacher.stream_ahead", "1"}}));

  in.kind = FailureKind::kNumerical;
  in.failed_role = Role::kStudent;
  in.context.lr = 2e-4;
  const auto nan = memory::compute_remedies(in);
  EXPECT_EQ(nan[0].changes.front(), (std::pair<std::string, std::string>{"train.lr", "0.0001"}));
}

// Several students and AdamW moments worth a tenth of the peak: student.shard optimizer is
// offered with what it frees; not once it is on, nor for a single student.
TEST(Diagnosis, ShardingIsOfferedWhereTheMomentsAndGradientsMatter) {
  auto in = student_oom();
  in.context.checkpointing = CheckpointPolicy::parse("all");
  in.context.batch_size = 1;
  in.context.precision = Precision::kBf16Mixed;
  in.context.student_ranks = 3;
  in.ranks[3].memory.model.optimizer_state_bytes = 800 * kMiB;  // 32% of the 2500 MiB peak
  in.ranks[3].memory.model.grads_bytes = 400 * kMiB;
  const auto remedies = memory::compute_remedies(in);
  ASSERT_EQ(remedies.size(), 1u);
  EXPECT_TRUE(test::contains(remedies[0].text, "rank 3 (student) holds 800.00 MiB of AdamW moments and 400.00 MiB of "
                                                "gradients: --student.shard gradients keeps 1/3 of both on each "
                                                "student (400.00 MiB;"))
      << remedies[0].text;
  EXPECT_TRUE(test::contains(remedies[0].text, "freeing 800.00 MiB")) << remedies[0].text;
  EXPECT_EQ(remedies[0].changes, (std::vector<std::pair<std::string, std::string>>{{"student.shard", "gradients"}}));
  // Moments already split: the gradients are what is left to offer.
  in.context.student_shard = ShardMode::kOptimizer;
  in.ranks[3].memory.model.optimizer_state_bytes = 800 * kMiB / 3;
  const auto left = memory::compute_remedies(in);
  ASSERT_EQ(left.size(), 1u);
  EXPECT_TRUE(test::contains(left[0].text, "holds 400.00 MiB of gradients: --student.shard gradients keeps 1/3 of "
                                           "them on each student (133.33 MiB;"))
      << left[0].text;
  in.context.student_shard = ShardMode::kGradients;
  EXPECT_TRUE(test::contains(memory::compute_remedies(in)[0].text, "no setting of this job frees memory"));
  in.context.student_shard = ShardMode::kNone;
  in.context.student_ranks = 1;
  EXPECT_TRUE(test::contains(memory::compute_remedies(in)[0].text, "no setting of this job frees memory"));
}

// A host student of fp32 weights worth a tenth of the peak: student.shard parameters is offered
// (with every block checkpointed, which it needs); not once it is on, nor on a GPU.
TEST(Diagnosis, ParameterShardingIsOfferedWhereAHostStudentsWeightsMatter) {
  auto in = student_oom();
  in.context.checkpointing = CheckpointPolicy::parse("off");
  in.context.batch_size = 1;
  in.context.student_shard = ShardMode::kGradients;
  in.context.student_ranks = 4;
  in.ranks[3].memory.model.weights_bytes = 800 * kMiB;  // 32% of the 2500 MiB peak
  const auto remedies = memory::compute_remedies(in);
  const auto it = std::find_if(remedies.begin(), remedies.end(),
                               [](const memory::Remedy& r) { return test::contains(r.text, "shard parameters"); });
  ASSERT_NE(it, remedies.end());
  EXPECT_TRUE(test::contains(it->text, "rank 3 (student) holds 800.00 MiB of weights: --student.shard parameters keeps "
                                       "a 1/4 slice of them on each student"))
      << it->text;
  EXPECT_TRUE(test::contains(it->text, "freeing about 600.00 MiB")) << it->text;
  EXPECT_EQ(it->changes, (std::vector<std::pair<std::string, std::string>>{{"student.shard", "parameters"},
                                                                           {"student.checkpointing", "all"}}));
  const auto offered = [&] {
    for (const auto& r : memory::compute_remedies(in)) {
      if (test::contains(r.text, "shard parameters")) return true;
    }
    return false;
  };
  in.context.student_shard = ShardMode::kParameters;
  EXPECT_FALSE(offered());
  in.context.student_shard = ShardMode::kGradients;
  in.ranks[3].memory.device.available = true;
  EXPECT_FALSE(offered());
}

// A LoRA pair's student holds both experts' frozen bases: one job per expert (student.expert) is
// offered where they matter; not for a student that is no pair.
TEST(Diagnosis, ALoraPairIsOfferedOneJobPerExpert) {
  auto in = student_oom();
  in.context.checkpointing = CheckpointPolicy::parse("all");
  in.context.batch_size = 1;
  in.context.precision = Precision::kBf16Mixed;
  in.ranks[3].memory.teacher_weights_bytes = 1000 * kMiB;  // the two bases: 40% of the 2500 MiB peak
  EXPECT_TRUE(test::contains(memory::compute_remedies(in)[0].text, "no setting of this job frees memory"));
  in.context.lora_pair = true;
  const auto remedies = memory::compute_remedies(in);
  ASSERT_EQ(remedies.size(), 1u);
  EXPECT_TRUE(test::contains(remedies[0].text, "rank 3 (student) holds the LoRA pair's two frozen expert bases "
                                               "(1000.00 MiB): --student.expert high, then a second job with "
                                               "--student.expert low"))
      << remedies[0].text;
  EXPECT_TRUE(test::contains(remedies[0].text, "freeing 500.00 MiB")) << remedies[0].text;
  EXPECT_EQ(remedies[0].changes, (std::vector<std::pair<std::string, std::string>>{{"student.expert", "high"}}));
}

TEST(Diagnosis, TheRequestSizeIsReadFromLibTorchsMessages) {
  std::exception_ptr failure;
  try {
    auto t = torch::empty({std::int64_t{1} << 48}, torch::kUInt8);  // 256 TiB, this LibTorch's own words
  } catch (...) {
    failure = std::current_exception();
  }
  ASSERT_TRUE(failure);
  EXPECT_EQ(memory::requested_bytes(failure_message(failure)), std::optional<std::uint64_t>(std::uint64_t{1} << 48))
      << failure_message(failure);
  // The CUDA caching allocator's wording (c10/cuda/CUDACachingAllocator.cpp, format_size).
  EXPECT_EQ(memory::requested_bytes("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
                                    "79.11 GiB of which 3.12 MiB is free."),
            std::optional<std::uint64_t>(20 * kMiB));
  EXPECT_EQ(memory::requested_bytes("Tried to allocate 1.50 GiB"), std::optional<std::uint64_t>(1536 * kMiB));
  EXPECT_FALSE(memory::requested_bytes("host allocation failed (std::bad_alloc)").has_value());
  EXPECT_FALSE(memory::requested_bytes("tried to allocate lots").has_value());
}

TEST(Diagnosis, ARequestBeyondAllOfARanksMemoryIsAWrongShapeNotABudget) {
  auto in = student_oom();
  in.message = "DefaultCPUAllocator: not enough memory: you tried to allocate 281474976710656 bytes.";
  for (auto& r : in.ranks) r.memory.host_total_bytes = 24 * 1024 * kMiB;
  const auto remedies = memory::compute_remedies(in);
  ASSERT_EQ(remedies.size(), 1u);
  EXPECT_TRUE(test::contains(remedies[0].text, "the failed request was 256.00 TiB, more than all the host memory of "
                                               "rank 3 (student) (24.00 GiB): a wrong shape, not a memory budget problem"))
      << remedies[0].text;
  EXPECT_TRUE(remedies[0].changes.empty());
  const auto text = memory::format_diagnosis(in);
  EXPECT_TRUE(test::contains(text, "request: 256.00 TiB of 24.00 GiB host memory in all: more than there is")) << text;
  EXPECT_FALSE(test::contains(text, "checkpointing all")) << text;
  EXPECT_FALSE(test::contains(text, "adjusted command")) << text;

  // On a GPU rank the device is what the request is held against: 80 GiB, 40 GiB reserved,
  // 30 GiB allocated at the peak and 10 GiB now (20 GiB of activations).
  auto& device = in.ranks[3].memory.device;
  device.available = true;
  device.total_bytes = 80 * 1024 * kMiB;
  device.reserved_bytes = device.peak_reserved_bytes = 40 * 1024 * kMiB;
  device.peak_allocated_bytes = 30 * 1024 * kMiB;
  device.allocated_bytes = 10 * 1024 * kMiB;
  in.message = "CUDA out of memory. Tried to allocate 120.00 GiB.";
  EXPECT_TRUE(test::contains(memory::compute_remedies(in)[0].text, "more than all the GPU memory of rank 3 (student) "
                                                                   "(80.00 GiB)"));

  // A request that fits the rank's memory gets the memory remedies, with its size named.
  in.message = "CUDA out of memory. Tried to allocate 2.00 GiB.";
  const auto budget = memory::compute_remedies(in);
  ASSERT_GE(budget.size(), 2u);
  EXPECT_EQ(budget[0].changes, (std::vector<std::pair<std::string, std::string>>{{"student.checkpointing", "all"}}));
  EXPECT_TRUE(test::contains(memory::format_diagnosis(in), "request: 2.00 GiB of 80.00 GiB GPU memory in all\n"));
}

TEST(Diagnosis, ActivationRemediesOnlyWhereActivationsMatter) {
  // Rank 3 at 1000 MiB with a peak of 1010 MiB: its activations are 10 MiB, 1% of the peak.
  auto in = student_oom();
  in.ranks[3].memory.peak_rss_bytes = 1010 * kMiB;
  for (auto& r : in.ranks) r.memory.host_total_bytes = 24 * 1024 * kMiB;
  in.message = "DefaultCPUAllocator: not enough memory: you tried to allocate 2147483648 bytes.";
  const auto none = memory::compute_remedies(in);
  ASSERT_EQ(none.size(), 1u);
  EXPECT_TRUE(test::contains(none[0].text, "no setting of this job frees memory on rank 3 (student) (its activations "
                                           "are 10.00 MiB, 0.9% of its 1010.00 MiB peak, against a failed request of "
                                           "2.00 GiB: checkpointing or a smaller batch frees too little to matter)"))
      << none[0].text;
  EXPECT_FALSE(test::contains(memory::format_diagnosis(in), "adjusted command")) << "nothing to adjust";
  // A request smaller than the activations: freeing them lets it through.
  in.message = "DefaultCPUAllocator: not enough memory: you tried to allocate 4194304 bytes.";
  const auto small = memory::compute_remedies(in);
  ASSERT_GE(small.size(), 2u);
  EXPECT_EQ(small[0].changes, (std::vector<std::pair<std::string, std::string>>{{"student.checkpointing", "all"}}));
  // No size in the message: the activations' share decides alone, and 1% is too little.
  in.message = "host allocation failed (std::bad_alloc)";
  EXPECT_EQ(memory::compute_remedies(in).size(), 1u);
  // At 10% of the peak they are offered whatever the request.
  in.ranks[3].memory.peak_rss_bytes = 1112 * kMiB;
  in.message = "DefaultCPUAllocator: not enough memory: you tried to allocate 2147483648 bytes.";
  EXPECT_EQ(memory::compute_remedies(in)[0].changes,
            (std::vector<std::pair<std::string, std::string>>{{"student.checkpointing", "all"}}));
}

TEST(Diagnosis, TheAdjustedCommandReplacesOrAppendsAndQuotes) {
  EXPECT_EQ(memory::adjusted_command({"--train.lr=0.1", "--run-dir", "my runs"}, {{"train.lr", "0.05"}}),
            "wan-distill train --train.lr=0.05 --run-dir 'my runs'");
  EXPECT_EQ(memory::adjusted_command({}, {{"comm.timeout_s", "240"}}), "wan-distill train --comm.timeout_s 240");
}

}  // namespace
}  // namespace wd::test_failure
