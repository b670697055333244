// Units of work spread over threads: for_each_unit(units, workers, body) runs body(unit) for every
// unit in [0, units) on up to `workers` threads (the calling one among them), each taking the
// next unit in order when it is done with one. The units must write disjoint memory. A failure
// is the serial loop's: once a unit throws, no unit after it starts (those before it still run),
// and the exception rethrown, after every thread has stopped, is the lowest failing unit's. The
// oracle (00_oracle.cpp), the reference-test library's same-precision backward and the
// simulator's sweep (sim/sweep.cpp) use it.
#pragma once

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace flashlab {

template <class Body>
void for_each_unit(int units, int workers, const Body& body) {
  workers = std::max(1, std::min(workers, units));
  std::atomic<int> next{0};
  std::mutex failure_mutex;  // guards failure and failed_at
  std::exception_ptr failure;
  int failed_at = units;
  auto work = [&] {
    for (int unit = next++; unit < units; unit = next++) {
      {
        const std::lock_guard<std::mutex> lock(failure_mutex);
        if (failure && unit > failed_at) return;
      }
      try {
        body(unit);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(failure_mutex);
        if (unit < failed_at) failure = std::current_exception(), failed_at = unit;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int w = 1; w < workers; ++w) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
}

// The machine's hardware threads, at least 1 and at most `cap`.
inline int hardware_workers(int cap = 32) {
  return std::max(1, std::min(static_cast<int>(std::thread::hardware_concurrency()), cap));
}

}  // namespace flashlab
