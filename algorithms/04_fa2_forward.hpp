// FlashAttention-2 forward pass (Dao 2023, Algorithm 1).
//
// The outer loop runs over query blocks Q_i; O_i and the softmax state (m, l) stay on chip for
// the whole inner loop over key/value blocks, and O_i is normalised once at the end. Compared
// with FA1 (03_fa1_forward.hpp) this reads Q and writes O exactly once, at the price of reading
// K and V once per query block. Key blocks the mask hides entirely (causal, window, block
// sparsity) are skipped, not masked: they are neither loaded nor computed.
#pragma once

#include <algorithm>

#include "online_softmax.hpp"
#include "tile_memory.hpp"
#include "tiling.hpp"

namespace flashlab {

struct Fa2Tiling {
  int block_rows = 64;  // Br: query rows per block
  int block_cols = 64;  // Bc: keys per block

  void validate() const {
    require_block_size("block_rows", block_rows);
    require_block_size("block_cols", block_cols);
  }
};

template <class Memory>
void fa2_forward(Memory& mem, const HeadProblem& head, const Fa2Tiling& tiling, const HeadTensors& x) {
  tiling.validate();
  const int Br = tiling.block_rows, Bc = tiling.block_cols;
  for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {  // line 3
    const Range rows{row_begin, std::min(Br, head.seqlen_q - row_begin)};
    mem.mark_line(4);
    Tile q = mem.load(x.Q, rows);  // line 4
    mem.mark_line(5);
    SoftmaxState state = start_softmax_state(mem, rows, head.head_dim_v);  // line 5
    const auto [first_key, last_key] = head.visible_key_range(rows.begin, rows.end());
    for (int col_begin = first_key / Bc * Bc; col_begin < last_key; col_begin += Bc) {  // line 6
      const Range cols{col_begin, std::min(Bc, head.seqlen_k - col_begin)};
      const auto coverage = head.coverage(rows.begin, rows.end(), cols.begin, cols.end());
      if (coverage == HeadProblem::BlockCoverage::empty) continue;  // skipped, not masked
      mem.mark_line(7);
      Tile k = mem.load(x.K, cols);  // line 7
      Tile v = mem.load(x.V, cols);
      mem.mark_line(8);
      Tile s = mem.matmul_nt(TensorId::S, q, k, head.scale);  // line 8
      if (coverage == HeadProblem::BlockCoverage::partial || head.modifies_scores()) mem.apply_score_mods(s, head);
      mem.mark_line(9);
      online_softmax_update(mem, state, s, v, head);  // lines 9-10
    }
    mem.mark_line(12);
    Tile lse = finish_softmax_state(mem, state);  // lines 12-13
    mem.mark_line(14);
    mem.store(x.O, rows, state.o);  // line 14
    mem.store(x.LSE, rows, lse);    // line 15
  }
}

}  // namespace flashlab
