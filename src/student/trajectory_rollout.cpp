// The student's own states for trajectory samples (trajectory_rollout.hpp).
#include "student/trajectory_rollout.hpp"

#include <algorithm>
#include <cmath>

#include "core/errors.hpp"
#include "model/image_condition.hpp"

namespace wd::student {

torch::Tensor nearest_interval(const torch::Tensor& t, const std::vector<double>& sigmas) {
  const auto grid = torch::tensor(std::vector<double>(sigmas.begin(), sigmas.end() - 1), torch::kDouble);
  const auto t0 = t.reshape({t.size(0), -1}).select(1, 0).to(torch::kDouble).cpu() / 1000.0;
  return (t0.unsqueeze(1) - grid.unsqueeze(0)).abs().argmin(1);
}

comm::TensorDict roll_out(StudentParts& parts, const comm::TensorDict& batch, const std::vector<double>& sigmas,
                          double fraction) {
  torch::NoGradGuard no_grad;
  const auto& x = batch.at("x_t");
  const auto B = x.size(0);
  const auto chosen = static_cast<std::int64_t>(std::llround(fraction * static_cast<double>(B)));
  if (chosen == 0) return batch;
  const auto start_it = batch.find("x_start");
  WD_CHECK(start_it != batch.end(), "train.trajectory_rollout needs each sample's noise (x_start) in the batch");
  WD_CHECK(sigmas.size() >= 2, "train.trajectory_rollout needs the student's σ (" << sigmas.size() << " given)");
  const auto device = x.device();
  const auto& t = batch.at("t");
  const auto interval = nearest_interval(t, sigmas);
  const auto iv = interval.accessor<std::int64_t, 1>();

  std::vector<std::int64_t> rolled;  // chosen samples past the first interval
  for (std::int64_t s = 0; s < chosen; ++s) {
    if (iv[s] >= 1) rolled.push_back(s);
  }
  if (rolled.empty()) return batch;
  const auto rows = torch::tensor(rolled, torch::kLong).to(device);
  auto y = start_it->second.index_select(0, rows).to(torch::kFloat);
  const auto context = batch.at("context").index_select(0, rows);
  const auto context_lens = batch.at("context_lens").index_select(0, rows.to(batch.at("context_lens").device()));
  const auto t_rows = t.index_select(0, rows.to(t.device()));
  const auto y_it = batch.find("y");  // an i2v image condition goes with every jump
  const auto image_y = y_it == batch.end() ? torch::Tensor() : y_it->second.index_select(0, rows);
  // ti2v's image mode: the tokens at t = 0 are the clean image, and it stays so through the jumps.
  const auto still = parts.frame_weights({{"t", t_rows}, {"x_t", y}});
  std::vector<std::int64_t> target_interval;
  for (const auto s : rolled) target_interval.push_back(iv[s]);
  const auto last = *std::max_element(target_interval.begin(), target_interval.end());
  for (std::int64_t j = 0; j < last; ++j) {
    // The samples still short of their σ_i jump from σ_j to σ_{j+1} together.
    std::vector<std::int64_t> moving;
    for (std::size_t r = 0; r < rolled.size(); ++r) {
      if (target_interval[r] > j) moving.push_back(static_cast<std::int64_t>(r));
    }
    const auto m = torch::tensor(moving, torch::kLong).to(device);
    comm::TensorDict step{{"x_t", y.index_select(0, m)},
                          {"t", timesteps_at(t_rows.index_select(0, m.to(t.device())), sigmas[static_cast<std::size_t>(j)])},
                          {"context", context.index_select(0, m)},
                          {"context_lens", context_lens.index_select(0, m.to(context_lens.device()))}};
    if (image_y.defined()) step["y"] = image_y.index_select(0, m);
    const auto v = parts.predict(step).to(torch::kFloat);
    const double dsigma = sigmas[static_cast<std::size_t>(j + 1)] - sigmas[static_cast<std::size_t>(j)];
    // A clean frame (weight 0) does not move.
    y.index_add_(0, m, still.defined() ? v * dsigma * still.index_select(0, m).to(v.scalar_type()) : v * dsigma);
  }
  // The teacher's next state from the sample's own target, and the jump from y to it.
  std::vector<double> gap;
  for (const auto i : target_interval) gap.push_back(sigmas[static_cast<std::size_t>(i + 1)] - sigmas[static_cast<std::size_t>(i)]);
  const auto shape = std::vector<std::int64_t>{static_cast<std::int64_t>(rolled.size()), 1, 1, 1, 1};
  const auto dsig = torch::tensor(gap, torch::kDouble).to(torch::kFloat).view(shape).to(device);
  const auto& target = batch.at("teacher_out");
  const auto next = x.index_select(0, rows) + dsig * target.index_select(0, rows);
  comm::TensorDict out = batch;
  out["x_t"] = x.index_copy(0, rows, y);
  out["teacher_out"] = target.index_copy(0, rows, ((next - y) / dsig).to(target.scalar_type()));
  return out;
}

}  // namespace wd::student
