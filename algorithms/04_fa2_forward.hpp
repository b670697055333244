// FlashAttention-2 forward pass (Dao 2023, Algorithm 1).
//
// The outer loop runs over query blocks Q_i; O_i and the softmax state (m, l) stay on chip for
// the whole inner loop over key/value blocks, and O_i is normalised once at the end. Compared
// with FA1 (03_fa1_forward.hpp) this reads Q and writes O exactly once, at the price of reading
// K and V once per query block. Key blocks the mask hides entirely (causal, window, block
// sparsity) are skipped, not masked: they are neither loaded nor computed.
#pragma once

#include <algorithm>

#include "pseudocode.hpp"
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

// Its pseudocode (pseudocode.hpp), the lines it marks.
inline const Pseudocode& fa2_forward_pseudocode() {
  static const Pseudocode code{"FlashAttention-2 forward (FA2 Algorithm 1)",
       {{0, "in HBM: Q, K, V (N x d); block sizes Br, Bc"},
        {1, "split Q into Tr blocks of Br rows; K, V into Tc blocks of Bc rows"},
        {2, "split O into Tr blocks of Br x d, L into Tr blocks of Br"},
        {3, "for i = 1 .. Tr:"},
        {4, "  load Q_i from HBM to SRAM"},
        {5, "  on chip: O_i = 0, l_i = 0, m_i = -inf"},
        {6, "  for j = 1 .. Tc:   (blocks hidden by the mask are skipped)"},
        {7, "    load K_j, V_j from HBM to SRAM"},
        {8, "    on chip: S_ij = tau Q_i K_j^T   (then the mask)"},
        {9, "    on chip: m_new = max(m_i, rowmax(S_ij)); P_ij = exp(S_ij - m_new);\n"
            "             l_i = exp(m_i - m_new) l_i + rowsum(P_ij)"},
        {10, "    on chip: O_i = diag(exp(m_i - m_new)) O_i + P_ij V_j; m_i = m_new"},
        {11, "  end for"},
        {12, "  on chip: O_i = diag(l_i)^-1 O_i"},
        {13, "  on chip: L_i = m_i + log(l_i)"},
        {14, "  write O_i to HBM"},
        {15, "  write L_i to HBM"},
        {16, "end for"},
        {17, "return O and the log-sum-exp L"}}};
  return code;
}

}  // namespace flashlab
