#include "progress.hpp"

#include <cstdio>
#include <utility>

namespace flashlab::sim {

namespace {
std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, seconds < 10 ? "%.2f s" : seconds < 100 ? "%.1f s" : "%.0f s", seconds);
  return text;
}
int whole_percent(std::size_t done, std::size_t total) {
  return total == 0 ? 100 : static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total));
}
}  // namespace

std::string progress_text(const std::string& label, std::size_t done, std::size_t total, double elapsed_seconds) {
  std::string text = label + ": " + std::to_string(done) + "/" + std::to_string(total) + " points (" +
                     std::to_string(whole_percent(done, total)) + "%), elapsed " + seconds_text(elapsed_seconds) + ", ETA ";
  if (done == 0) return text + "?";
  const double left = elapsed_seconds * static_cast<double>(total - done) / static_cast<double>(done);
  return text + seconds_text(left);
}

ProgressLine::ProgressLine(std::ostream& out, std::string label, bool terminal)
    : out_(out), label_(std::move(label)), terminal_(terminal) {}

void ProgressLine::update(std::size_t done, std::size_t total) {
  update(done, total, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
}

void ProgressLine::update(std::size_t done, std::size_t total, double elapsed_seconds) {
  const int percent = whole_percent(done, total);
  if (terminal_) {
    out_ << "\r" << progress_text(label_, done, total, elapsed_seconds) << "   " << (done >= total ? "\n" : "") << std::flush;
    return;
  }
  if (percent == last_percent_) return;
  last_percent_ = percent;
  out_ << progress_text(label_, done, total, elapsed_seconds) << "\n" << std::flush;
}

}  // namespace flashlab::sim
