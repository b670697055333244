// What the Python bindings of the tile-memory interface check before an op runs. A C++ schedule
// gets these guarantees from its types and scopes; a Python schedule can pass anything, so each
// is checked here and refused with std::invalid_argument naming the op, the argument and what is
// allowed (a ValueError in Python), never a crash:
//   - a tile lives in the memory model the op is called on (not another model's, not freed or
//     moved into a softmax state);
//   - an HBM tensor a data run reads or writes has data (not a shape-only view or an absent
//     backward buffer);
//   - a Range lies in [0, INT_MAX]; a tile made on chip has sizes >= 1 (and, with data, fits the
//     host memory of a data run); positions a head's mask rule is asked about lie inside the
//     head's sequences.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "algorithms/limits.hpp"
#include "algorithms/problem.hpp"
#include "algorithms/tensors.hpp"
#include "algorithms/tile_memory.hpp"

namespace flashlab::python {

template <class Memory>
const Tile& held(const Memory& mem, const Tile& tile, const char* op, const char* argument) {
  if (!mem.holds(tile)) {
    const std::string why = tile.arena() == nullptr
                                ? "was freed (or moved into a softmax state)"
                                : "belongs to another memory model";
    throw std::invalid_argument(std::string(op) + ": tile '" + argument + "' " + why +
                                "; allowed: a live tile made by this memory model");
  }
  return tile;
}
template <class Memory>
Tile& held(const Memory& mem, Tile& tile, const char* op, const char* argument) {
  held(mem, static_cast<const Tile&>(tile), op, argument);
  return tile;
}

// A data run moves values: the tensor must have them.
template <class Memory>
void require_hbm_data(const HbmMatrix& tensor, const char* op) {
  if constexpr (Memory::with_data) {
    if (tensor.rows == 0 || tensor.cols == 0) {
      throw std::invalid_argument(std::string(op) + " of " + to_string(tensor.id) +
                                  ": this run has no such tensor (a backward buffer of a forward run); allowed: "
                                  "the tensors the run allocates");
    }
    if (tensor.data == nullptr) {
      throw std::invalid_argument(std::string(op) + " of " + to_string(tensor.id) +
                                  ": a shape-only view holds no values; allowed: the tensors of a data run "
                                  "(or a ShapeMemory)");
    }
  }
}

// A Range made in Python: C++ forms begin + size unchecked, so it must fit an int.
inline void require_range(int begin, int size) {
  if (begin < 0 || size < 0 || begin > std::numeric_limits<int>::max() - size) {
    throw std::invalid_argument("Range(" + std::to_string(begin) + ", " + std::to_string(size) +
                                "); allowed: begin >= 0, size >= 0, begin + size <= " +
                                std::to_string(std::numeric_limits<int>::max()));
  }
}

// A tile made on chip: sizes >= 1 and, in a data run, values that fit the host memory of one.
template <class Memory>
void require_tile_sizes(Range rows, Range cols, const char* op) {
  if (rows.size < 1 || cols.size < 1) {
    throw std::invalid_argument(std::string(op) + ": a tile of " + std::to_string(rows.size) + " x " +
                                std::to_string(cols.size) + "; allowed: sizes >= 1");
  }
  const std::int64_t bytes = std::int64_t{rows.size} * cols.size * std::int64_t{sizeof(float)};
  if (Memory::with_data && bytes > kMaxDataBytes) {
    throw std::invalid_argument(std::string(op) + ": a tile of " + std::to_string(rows.size) + " x " +
                                std::to_string(cols.size) + " holds " + std::to_string(bytes) +
                                " bytes of values; allowed: at most " + std::to_string(kMaxDataBytes) +
                                " (the host memory of a data run)");
  }
}

// [begin, end) inside [0, extent), not empty.
inline void require_span(const char* op, const char* what, int begin, int end, int extent, const char* extent_name) {
  if (begin < 0 || end <= begin || end > extent) {
    throw std::invalid_argument(std::string(op) + ": " + what + " [" + std::to_string(begin) + ", " +
                                std::to_string(end) + "); allowed: 0 <= begin < end <= " + extent_name + " = " +
                                std::to_string(extent));
  }
}

// A score tile's rows are queries and its columns keys of the head.
inline void require_score_tile(const Tile& tile, const HeadProblem& head, const char* op) {
  require_span(op, "rows of the tile", tile.rows().begin, tile.rows().end(), head.seqlen_q, "seqlen_q");
  require_span(op, "cols of the tile", tile.cols().begin, tile.cols().end(), head.seqlen_k, "seqlen_k");
}

}  // namespace flashlab::python
