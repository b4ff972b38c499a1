// CopyWorker: the thread both copy engines of the block streamer run their copies on.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "teacher/block_streamer.hpp"

namespace wd::teacher {

/// Runs one job per started slot, in the order started, on its own thread. `wait(slot)`
/// returns once the slot's job has run, rethrows the first job failure, and throws past the
/// deadline. Joined on destruction (after the jobs already queued).
class CopyWorker {
 public:
  using Run = std::function<void(std::size_t slot, CopyEngine::Copies& copies)>;
  /// `what` names the work in a timeout ("the copy of a block").
  CopyWorker(std::size_t slots, double timeout_s, std::string what, Run run);
  ~CopyWorker();
  CopyWorker(const CopyWorker&) = delete;
  CopyWorker& operator=(const CopyWorker&) = delete;

  void start(std::size_t slot, CopyEngine::Copies copies);
  void wait(std::size_t slot);

 private:
  struct Job {
    std::size_t slot;
    CopyEngine::Copies copies;
  };
  void loop();

  Run run_;
  std::string what_;
  std::chrono::duration<double> timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> jobs_;
  std::vector<bool> done_;
  std::exception_ptr failure_;
  bool stopping_ = false;
  std::thread thread_;  ///< last: started once everything above exists
};

}  // namespace wd::teacher
