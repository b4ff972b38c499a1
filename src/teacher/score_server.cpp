// ScoreServer: gather the cycle's requests, one guided forward, scatter the answers.
#include "teacher/score_server.hpp"

#include <chrono>

#include "core/errors.hpp"

namespace wd::teacher {

void ScoreServer::after_stream_step(std::int64_t step) {
  while (next_ < schedule_.end_cycle() && schedule_.answer_after(next_) <= step) answer(next_++, step);
}

void ScoreServer::answer(std::int64_t cycle, std::int64_t step) {
  std::vector<torch::Tensor> x, t, context, lens;
  for (auto& requests : service_.requests) {
    const auto& m = requests->recv(cycle);
    x.push_back(m.at("x_t"));
    t.push_back(m.at("t"));
    context.push_back(m.at("context"));
    lens.push_back(m.at("context_lens"));
  }
  if (health_) health_->at(step + 1, "real-score answer");
  if (faults_) faults_->at(FaultSpec::Point::kServe, step + 1, x.front().device());
  const auto t0 = std::chrono::steady_clock::now();
  StageBatch batch;
  batch.x_t = torch::cat(x);  // copies: the request slots are free again below
  batch.t = torch::cat(t);
  batch.context = torch::cat(context);
  batch.context_lens = torch::cat(lens);
  for (auto& requests : service_.requests) requests->release(cycle);
  stage_.run(batch);
  const auto bad = (~torch::isfinite(batch.out)).sum().item<std::int64_t>();
  if (bad > 0) {
    throw NumericalError("the teacher's real-score answer for cycle " + std::to_string(cycle) + " has " +
                         std::to_string(bad) + " NaN/Inf values of " + std::to_string(batch.out.numel()));
  }
  std::vector<comm::TensorDict> answers;
  std::int64_t lo = 0;
  for (const auto& part : x) {
    answers.push_back({{"teacher_out", batch.out.slice(0, lo, lo + part.size(0))}});
    lo += part.size(0);
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
