// The flat layout every student.shard mode shares (OptimizerShard, GradientScatter,
// ParameterGather): the parameters laid end to end in order, padded to N equal slices.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace wd::student {

/// Parameter i's elements are [offsets[i], offsets[i] + numel) of one flat vector padded to
/// group_size slices of slice_size elements; group rank r owns [r·S, (r+1)·S), and this rank's
/// slice starts at slice_begin (= group_rank·S).
struct SliceLayout {
  std::vector<std::int64_t> offsets;
  std::int64_t slice_begin = 0, slice_size = 0;
  int group_size = 1, group_rank = 0;

  /// Adds to counts[r] how many elements of the flat range [begin, end) lie in rank r's slice
  /// (counts has group_size entries).
  void count_in_slices(std::int64_t begin, std::int64_t end, std::vector<std::int64_t>& counts) const {
    for (auto r = std::max<std::int64_t>(0, begin / slice_size); r < group_size && r * slice_size < end; ++r) {
      counts[r] += std::max<std::int64_t>(0, std::min(end, (r + 1) * slice_size) - std::max(begin, r * slice_size));
    }
  }
};

}  // namespace wd::student
