// A schedule's pseudocode, numbered as in the paper the schedule cites, so the line a schedule
// marks (TileMemory::mark_line) is the line shown. Each schedule's file in algorithms/ writes its
// own (from the paper's algorithm, in our words; tau is the softmax scale); the registry entry
// points at it and the visualizer renders it.
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace flashlab {

struct PseudocodeLine {
  int number = 0;  // the paper's line number; 0: a heading without a number
  std::string text;
};

struct Pseudocode {
  std::string title;  // "FlashAttention-2 forward (FA2 Algorithm 1)"
  std::vector<PseudocodeLine> lines;

  bool has_line(int number) const {
    return std::any_of(lines.begin(), lines.end(), [number](const PseudocodeLine& l) { return l.number == number; });
  }
  // A variant: this pseudocode under another title with one numbered line rewritten.
  Pseudocode with_line(std::string new_title, int number, const std::string& text) const {
    Pseudocode code = *this;
    code.title = std::move(new_title);
    for (PseudocodeLine& line : code.lines)
      if (line.number == number) line.text = text;
    return code;
  }
};

}  // namespace flashlab
