// ScoreServer: gather the cycle's requests, one guided forward, scatter the answers.
#include "teacher/score_server.hpp"

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "core/sequence_groups.hpp"

namespace wd::teacher {

void ScoreServer::after_stream_step(std::int64_t step) {
  while (next_ < schedule_.end_cycle() && schedule_.answer_after(next_) <= step) answer(next_++, step);
}

void ScoreServer::answer(std::int64_t cycle, std::int64_t step) {
  // Every student's request, concatenated by name (copies: the request slots are free again
  // below). The ranks of a sequence-parallel group ask alike: its first rank's request is run.
  std::map<std::string, std::vector<torch::Tensor>> parts;
  std::vector<std::int64_t> rows;
  for (std::size_t slot = 0; slot < service_.requests.size(); ++slot) {
    const auto& m = service_.requests[slot]->recv(cycle);
    if (!SequenceGroups{sequence_parallel_}.leads(static_cast<std::int64_t>(slot))) continue;
    for (const auto& [name, tensor] : m.tensors) parts[name].push_back(tensor);
    rows.push_back(m.at("x_t").size(0));
  }
  if (health_) health_->at(step + 1, "real-score answer");
  if (faults_) faults_->at(FaultSpec::Point::kServe, step + 1, parts.at("x_t").front().device());
  const auto t0 = std::chrono::steady_clock::now();
  std::map<std::string, torch::Tensor> joined;
  for (const auto& [name, list] : parts) joined[name] = torch::cat(list);
  auto batch = StageBatch::inputs_of(joined);  // with an i2v teacher's y
  for (auto& requests : service_.requests) requests->release(cycle);
  stage_.run(batch);
  const auto bad = (~torch::isfinite(batch.out)).sum().item<std::int64_t>();
  if (bad > 0) {
    throw NumericalError("the teacher's real-score answer for cycle " + std::to_string(cycle) + " has " +
                         std::to_string(bad) + " NaN/Inf values of " + std::to_string(batch.out.numel()));
  }
  std::vector<comm::TensorDict> answers;
  std::int64_t lo = 0;
  for (const auto n : rows) {
    for (int r = 0; r < sequence_parallel_; ++r) answers.push_back({{"teacher_out", batch.out.slice(0, lo, lo + n)}});
    lo += n;
  }
  service_.answers->send(cycle, answers);
  answered_ += lo;
  busy_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double ScoreServer::wait_seconds() const {
  double s = service_.answers->wait_seconds();
  for (const auto& r : service_.requests) s += r->wait_seconds();
  return s;
}

}  // namespace wd::teacher
