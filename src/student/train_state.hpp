// Training state of a student for an exact resume: fp32 master weights, AdamW moments and step
// counts, the CPU generator, the step cursor, the config text, and the exported student.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>

#include "core/config.hpp"
#include "student/checkpoint_config.hpp"
#include "model/safetensors.hpp"
#include "student/optimizer_shard.hpp"
#include "student/student_parts.hpp"
#include "student/train_optimizer.hpp"

namespace wd::student {

/// Where training stands. The data order and noise are pure functions of (seed, step), so the
/// step is also the data cursor.
struct TrainCursor {
  std::int64_t step = 0;  ///< completed optimizer steps
};

/// The files save_train_state() writes into a checkpoint directory.
struct TrainStateFiles {
  static constexpr const char* kTrainable = "trainable.safetensors";
  static constexpr const char* kOptimizer = "optimizer.safetensors";
  static constexpr const char* kTrainer = "trainer.json";
  static constexpr const char* kConfig = "config.ini";
  static constexpr const char* kStudent = "student";  ///< directory: what users load
};

/// The file of student rank `index`'s moment slice among `count`:
/// "optimizer-slice-00001-of-00004.safetensors".
std::string moment_slice_file(int index, int count);

/// Writes `slice` (OptimizerShard::moment_slice) into `dir` as moment_slice_file(): tensors
/// "exp_avg" and "exp_avg_sq" of slice.size elements, its place in the flat layout as metadata.
void write_moment_slice(const std::string& dir, const MomentSlice& slice);

/// Writes the training state into the existing directory `dir`: trainable.safetensors (fp32
/// master weights under trainable_names()), optimizer.safetensors (per tensor
/// "<name>.exp_avg", ".exp_avg_sq", ".max_exp_avg_sq" with amsgrad, ".step"; options as
/// metadata), trainer.json (step, CPU generator state), config.ini (`config_ini` verbatim), and
/// with `export_student` the student as parts.save() writes it into student/.
/// The optimizer must have one parameter group over parts.trainable().
/// `slice` (student.shard: this rank's OptimizerShard::moment_slice): optimizer.safetensors then
/// holds the ".step" counts and the flat layout (parameter order, slice count and size), and the
/// moments are in one moment_slice_file() per student rank, this one written here, the others
/// by their ranks into the same directory. Either way a checkpoint resumes sharded or not, on
/// any student count.
void save_train_state(const std::string& dir, const StudentParts& parts,
                      const torch::optim::AdamW& optimizer, const TrainCursor& cursor,
                      const std::string& config_ini, bool export_student = true,
                      const MomentSlice* slice = nullptr);

/// Checks that `file` holds `name` with exactly `like`'s dtype and shape; a wd::DataError naming
/// the file and tensor otherwise (the check every restore of saved tensors makes first).
void expect_saved_tensor(const SafetensorsFile& file, const std::string& name, const torch::Tensor& like);

/// Restores what save_train_state() wrote into `parts` (in place, so the optimizer's and the
/// gradient reducer's references stay valid) and `optimizer`, restores the CPU generator and
/// refreshes the bf16 compute copy. Everything is checked before anything is changed: a tensor
/// missing, extra, or of another shape or dtype is a wd::DataError naming the file and tensor.
/// The optimizer's lr is restored; other hyper-parameters that differ stay as the caller set
/// them (logged as a warning: a deliberate change on resume is allowed).
/// With `shard`, the optimizer steps the shard's views and gets their slices of the moments.
/// Moments saved in slices are read from the slice files that overlap what each tensor (or view)
/// needs, whatever the number of slices then and now.
TrainCursor load_train_state(const std::string& dir, StudentParts& parts, torch::optim::AdamW& optimizer,
                             const OptimizerShard* shard = nullptr);

/// One trainable model's training state on this rank (the student, dmd's critic): its parts and
/// its optimizer (whole, or under student.shard over its slice). Every trainable saves
/// (TrainableSave) and restores through this one path.
struct Trainable {
  StudentParts& parts;
  TrainOptimizer& optimizer;

  /// Restores what a TrainableSave wrote into `dir` (load_train_state, every block whole while it
  /// loads under student.shard parameters: collective over the students). A wd::DataError naming
  /// `dir`'s trainer.json when its step is not `step`, "differs from <whose> step" (e.g. "the
  /// manifest's").
  void restore(const std::string& dir, std::int64_t step, const std::string& whose) const;
};

/// A trainable's share of one checkpoint after `steps_done` steps. Begun on every student at the
/// same point: under student.shard parameters its blocks are whole while it lives, and under
/// student.shard its moment slice is taken (both collective). The first student writes it
/// (write: save_train_state), each student its slice (write_slice).
class TrainableSave {
 public:
  TrainableSave(const Trainable& trainable, std::int64_t steps_done);
  bool sliced() const { return slice_.has_value(); }
  void write(const std::string& dir, const std::string& config_ini, bool export_student) const;
  void write_slice(const std::string& dir) const;

 private:
  Trainable trainable_;
  std::int64_t steps_done_;
  WholeWeights whole_;
  std::optional<MomentSlice> slice_;
};

}  // namespace wd::student
