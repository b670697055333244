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

// The threads for_each_unit runs `units` on: `workers`, at least 1 and at most one per unit.
template <class Index>
int unit_workers(Index units, int workers) {
  if (workers <= 1 || units <= 1) return 1;
  return static_cast<Index>(workers) < units ? workers : static_cast<int>(units);
}

// Index: any integer type (the sweep counts its points in std::size_t).
template <class Index, class Body>
void for_each_unit(Index units, int workers, const Body& body) {
  workers = unit_workers(units, workers);
  std::atomic<Index> next{0};
  std::mutex failure_mutex;  // guards failure and failed_at
  std::exception_ptr failure;
  Index failed_at = units;
  auto work = [&] {
    for (Index unit = next++; unit < units; unit = next++) {
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
