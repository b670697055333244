// The pseudocode the visualizer shows next to each schedule: each schedule's own, written beside
// it in algorithms/ (algorithms/pseudocode.hpp) and reached through its registry entry, so the
// line a schedule marks (TileMemory::mark_line) is the line highlighted.
#pragma once

#include <string_view>

#include "algorithms/pseudocode.hpp"

namespace flashlab::viz {

using flashlab::Pseudocode;
using flashlab::PseudocodeLine;

// The pseudocode of a registry schedule, or nullptr for a name the registry does not hold.
const Pseudocode* find_pseudocode(std::string_view schedule);

}  // namespace flashlab::viz
