// The pseudocode the visualizer shows next to each schedule, numbered as in the paper the
// schedule cites, so the line a schedule marks (TileMemory::mark_line) is the line highlighted.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace flashlab::viz {

struct PseudocodeLine {
  int number = 0;    // the paper's line number; 0: a heading without a number
  std::string text;
};

struct Pseudocode {
  std::string title;  // "FlashAttention-2 forward (FA2 Algorithm 1)"
  std::vector<PseudocodeLine> lines;
  bool has_line(int number) const;
};

// The pseudocode of a registry schedule, or nullptr when none is written for it.
const Pseudocode* find_pseudocode(std::string_view schedule);

}  // namespace flashlab::viz
