// Progress of a long count, on stderr: "sweep: 12/48 points (25%), elapsed 0.31 s, ETA 0.93 s".
// On a terminal one line is rewritten in place (carriage return) on every update; elsewhere (a
// log file, a pipe, CI) a new line is written each time the whole percent changes, so a run
// writes at most one line per point and at most 101 lines in all.
#pragma once

#include <chrono>
#include <cstddef>
#include <ostream>
#include <string>

namespace flashlab::sim {

// The text of one progress line, without a line end. The ETA is the elapsed time scaled by the
// points left over the points done ("ETA ?" before the first point).
std::string progress_text(const std::string& label, std::size_t done, std::size_t total, double elapsed_seconds);

class ProgressLine {
 public:
  ProgressLine(std::ostream& out, std::string label, bool terminal);
  void update(std::size_t done, std::size_t total);                          // elapsed time from the clock
  void update(std::size_t done, std::size_t total, double elapsed_seconds);  // elapsed time given (tests)

 private:
  std::ostream& out_;
  std::string label_;
  bool terminal_;
  int last_percent_ = -1;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace flashlab::sim
