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

// FA2 swaps FA1's loops, so the roles of line 1's side (tiling.hpp: fa1_block_side): Br = side,
// Bc = min(side, d).
inline BlockTiling fa2_tiling_of_side(int side, int head_dim) { return {side, std::min(side, head_dim)}; }

// Its working set (tiling.hpp: WorkingSetDims), lines 4-10: Q_i, O_i, K_j, V_j, S_ij, P_ij; m, l,
// m_new, rescale, rowsum(P). With `group` query heads packed beside one K_j, V_j (split-KV
// decoding): group times Q_i, O_i, m, l, and one head's S, P and update temporaries at a time.
inline std::int64_t fa2_working_set_bytes(const Problem& p, int block_rows, int block_cols, int group = 1) {
  const WorkingSetDims t(p, block_rows, block_cols);
  const CheckedInt64 g = group;
  return (t.e * (g * (t.r * t.d + t.r * t.dv) + t.c * t.d + t.c * t.dv + 2 * t.r * t.c) + 2 * t.f * g * t.r + 3 * t.f * t.r)
      .value();
}

template <class Memory>
void fa2_forward(Memory& mem, const HeadProblem& head, const BlockTiling& tiling, const HeadTensors& x) {
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
