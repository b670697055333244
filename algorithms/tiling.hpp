// What every schedule's tiling checks: a block size (query rows, keys or elements per block) is
// at least 1.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "checked_math.hpp"
#include "problem.hpp"

namespace flashlab {

// A block size below 1 throws std::invalid_argument naming it and its range:
// "block_rows = 0; allowed: >= 1".
inline void require_block_size(const char* name, int size) {
  if (size < 1)
    throw std::invalid_argument(std::string(name) + " = " + std::to_string(size) +
                                "; allowed: >= 1");
}

// The block tiling of every schedule that cuts Q into blocks of rows and K, V into blocks of keys
// (standard attention, FA1, FA2, their backward passes, block-sparse, memory-efficient chunks).
// Square tiling (one side B) and split-KV decoding (KV chunks) have their own.
struct BlockTiling {
  int block_rows = 64;  // Br: query rows per block
  int block_cols = 64;  // Bc: keys per block

  void validate() const {
    require_block_size("block_rows", block_rows);
    require_block_size("block_cols", block_cols);
  }
};

// FA1 Algorithm 1, line 1: the paper's block side ceil(M / 4d), M the SRAM size in elements
// (at least 1). FA1 takes Bc = side, Br = min(side, d); FA2 swaps the roles; the backward passes
// and block-sparse keep FA1's shape; standard attention caps its square blocks by it.
inline std::int64_t fa1_block_side(std::int64_t m_elements, std::int64_t head_dim) {
  return (std::max<std::int64_t>(m_elements, 1) + 4 * head_dim - 1) / (4 * head_dim);
}

// What a schedule's working set (the SRAM it holds at its peak, in bytes) is written in, for one
// head of a problem with full blocks: r = min(Br, Nq) query rows, c = min(Bc, Nk) keys, d, dv,
// the dtype's element bytes e and the fp32 statistics' f = 4, in checked products (a size past
// int64 throws SizeOverflow). Each schedule's header writes its own working set in these.
struct WorkingSetDims {
  CheckedInt64 r, c, nk, d, dv, e, f = 4;
  WorkingSetDims(const Problem& p, int block_rows, int block_cols)
      : r(std::min(block_rows, p.seqlen_q)), c(std::min(block_cols, p.seqlen_k)), nk(p.seqlen_k), d(p.head_dim),
        dv(p.value_dim()), e(element_bytes(p.dtype)) {}
};

}  // namespace flashlab
