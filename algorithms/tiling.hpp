// What every schedule's tiling checks: a block size (query rows, keys or elements per block) is
// at least 1.
#pragma once

#include <stdexcept>
#include <string>

namespace flashlab {

// A block size below 1 throws std::invalid_argument naming it and its range:
// "block_rows = 0; allowed: >= 1".
inline void require_block_size(const char* name, int size) {
  if (size < 1)
    throw std::invalid_argument(std::string(name) + " = " + std::to_string(size) +
                                "; allowed: >= 1");
}

}  // namespace flashlab
