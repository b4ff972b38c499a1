// The classes of a `make-dataset --kind classes` data set, and the classifier of generated
// latents the objectives' bench scores samples with (docs/objectives.md).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace wd::data {

/// /class_patterns [K,C,F,H,W] and /labels [N] of a data set; empty when it has none.
struct DatasetClasses {
  torch::Tensor patterns;             ///< float32; undefined when the file has no classes
  std::vector<std::int64_t> labels;  ///< per sample
  bool present() const { return patterns.defined(); }
};

/// Reads them; DataError naming the file and the dataset for a malformed one.
DatasetClasses read_dataset_classes(const std::string& path);

/// Each latent's best class, invariant to where the pattern sits and how strong it is: for every
/// class and frame, the cosine similarity between the frame and the class's frame at the best
/// circular shift in H and W (cross-correlation by FFT), averaged over frames.
struct Classified {
  torch::Tensor label;    ///< [B] int64, the best class
  torch::Tensor cosine;   ///< [B] float32, its mean best-shift cosine
  torch::Tensor cosines;  ///< [B,K] float32, every class's mean best-shift cosine
  torch::Tensor shift;    ///< [B,2] int64, the best class's best (dy, dx) shift in the first frame
};
Classified classify_latents(const torch::Tensor& latents, const torch::Tensor& patterns);

/// Each frame's best class and where it sits: for every frame f and class k, the cosine between
/// the frame and the class's frame f at the best circular shift in H and W (frame by frame, not
/// averaged: a video whose later frames turn into another class shows it here).
struct FrameClasses {
  torch::Tensor label;   ///< [B,F] int64, each frame's best class
  torch::Tensor cosine;  ///< [B,F] float32, its best-shift cosine
  torch::Tensor shift;   ///< [B,F,2] int64, its best (dy, dx) shift, in [0, H) x [0, W)
  std::int64_t height = 0, width = 0;  ///< the latents' H and W (the shifts' circle)
};
FrameClasses classify_frames(const torch::Tensor& latents, const torch::Tensor& patterns);

/// The share of samples that continue their image (the bench's condition_accuracy): `image`
/// classifies each sample's condition (its first frame, against the patterns' first frame), and
/// a sample counts when every frame f >= 1 of `frames` is of the image's class at a best-shift
/// cosine of at least `strict_cosine` and sits within one row and one column (circularly) of
/// frame f - 1's position, frame 0's being the image's: the motion a classes data set's frames
/// make. `frames` [B,F], `image` [B,1].
double condition_accuracy(const FrameClasses& frames, const FrameClasses& image, double strict_cosine = 0.95);

/// The two accuracies of generated latents against their intended classes: the right class,
/// and the right class with a best-shift cosine of at least `strict_cosine` (the plain one is
/// too easy to tell a good sampler from a poor one).
struct ClassAccuracy {
  double class_accuracy = 0;
  double strict_accuracy = 0;
};
ClassAccuracy class_accuracy(const Classified& got, const std::vector<std::int64_t>& wanted,
                             double strict_cosine = 0.95);

}  // namespace wd::data
