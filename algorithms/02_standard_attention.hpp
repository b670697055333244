// Standard attention (Dao et al. 2022, FlashAttention, Algorithm 0): the baseline FlashAttention
// improves on. The whole score matrix S and probability matrix P round-trip through HBM:
//   line 1: S = Q K^T, written to HBM,
//   line 2: S read back, P = softmax(S), written to HBM,
//   line 3: P and V read back, O = P V, written to HBM.
// S and P are HBM tensors of the problem's dtype, so a bf16/fp16 run rounds them exactly where
// a naive framework implementation would: this schedule is the "naive implementation in the
// same precision" of the low-precision rule (tests/reference). Every block is computed; masked
// scores are -inf in S (nothing is skipped: that is FlashAttention's job).
//
// Beyond the paper's O this writes LSE = m + log(l) of each row in line 2, so every forward
// schedule returns the same outputs. Dropout (FA1 Algorithm 2's convention) multiplies P as it
// is read back in line 3; P in HBM stays the undropped softmax.
//
// SRAM: every line holds Br x Bc tiles, so the working set fits any M that holds three of them
// (closed_forms.cpp: working_set). Line 2 needs each row's max and sum before it can write P,
// so when a row spans more than one key block (Bc < seqlen_k) it reads S twice, by blocks: once
// for the row statistics m, l (the online recurrence of Milakov and Gimelshein, as FA2's
// line 10 keeps them) and once to write P_ij = exp(S_ij - m) / l. When one block holds the whole
// row (Bc >= seqlen_k) S_i is read once, as the paper's line 2 does. Either way the traffic is
// Theta(N d + N^2) (FA1 Theorem 2): the row-block form adds one N^2 read of S.
#pragma once

#include <algorithm>

#include "pseudocode.hpp"
#include "tile_memory.hpp"
#include "tiling.hpp"

namespace flashlab {


// Its working set (tiling.hpp: WorkingSetDims): the largest of its three passes.
inline std::int64_t standard_attention_working_set_bytes(const Problem& p, int block_rows, int block_cols) {
  const WorkingSetDims t(p, block_rows, block_cols);
  const CheckedInt64 r = t.r, c = t.c, d = t.d, dv = t.dv, e = t.e, f = t.f;
  return std::max({e * (r * d + c * d + r * c),            // line 1: Q_i, K_j, S_ij
                   c >= t.nk ? 2 * e * r * t.nk + 3 * f * r  // line 2, whole rows of S and P; m, l, LSE
                             : 2 * e * r * c + 5 * f * r,    // or blocks S_ij, P_ij; m, l, m_new, rescale, rowsum
                   e * (r * dv + r * c + c * dv)})           // line 3: O_i, P_ij, V_j
      .value();
}
// Its block rule from M elements: square blocks up to min(ceil(M / 4d), d) (its traffic does not
// fall with larger ones); no paper rule.
inline std::int64_t standard_attention_block_side(std::int64_t m_elements, std::int64_t head_dim) {
  return std::min(fa1_block_side(m_elements, head_dim), head_dim);
}

template <class Memory>
void standard_attention(Memory& mem, const HeadProblem& head, const BlockTiling& tiling,
                        const HeadTensors& x) {
  tiling.validate();
  const int Br = tiling.block_rows, Bc = tiling.block_cols;
  HbmScratch scratch(Memory::with_data);
  const HbmMatrix S = scratch.matrix(TensorId::S, head.dtype, head.seqlen_q, head.seqlen_k);
  const HbmMatrix P = scratch.matrix(TensorId::P, head.dtype, head.seqlen_q, head.seqlen_k);
  const auto row_block = [&](int begin) {
    return Range{begin, std::min(Br, head.seqlen_q - begin)};
  };
  const auto col_block = [&](int begin) {
    return Range{begin, std::min(Bc, head.seqlen_k - begin)};
  };

  // Line 1: load Q, K by blocks from HBM, compute S = QK^T (scaled, modified, masked), write S.
  for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {
    const Range rows = row_block(row_begin);
    mem.mark_line(1);
    Tile q = mem.load(x.Q, rows);
    for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += Bc) {
      const Range cols = col_block(col_begin);
      Tile k = mem.load(x.K, cols);
      Tile s = mem.matmul_nt(TensorId::S, q, k, head.scale);
      mem.apply_score_mods(s, head);
      mem.store(S, rows, cols, s);
    }
  }

  // Line 2: read S from HBM, compute P = softmax(S) row by row, write P (and LSE).
  for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {
    const Range rows = row_block(row_begin);
    mem.mark_line(2);
    if (Bc >= head.seqlen_k) {  // one block holds the whole row: S_i read once
      Tile s = mem.load(S, rows);
      Tile m = mem.row_max(TensorId::m, s);
      Tile p = mem.exp_minus_row(TensorId::P, s, m);  // a fully masked row gives zeros
      Tile l = mem.row_sum(TensorId::l, p);
      mem.divide_rows(p, l);
      mem.store(P, rows, p);
      Tile lse = mem.log_sum_exp(TensorId::LSE, m, l);
      mem.store(x.LSE, rows, lse);
      continue;
    }
    // Row-block form: the row statistics over the key blocks first (online max and sum) ...
    Tile m = mem.vector(TensorId::m, rows, kNegInf);
    Tile l = mem.vector(TensorId::l, rows, 0.0f);
    for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += Bc) {
      Tile s = mem.load(S, rows, col_block(col_begin));
      Tile m_new = mem.row_max(TensorId::m, s);
      mem.maximum(m_new, m);
      Tile p = mem.exp_minus_row(TensorId::P, s, m_new);
      Tile rescale = mem.exp_difference(TensorId::m, m, m_new);
      Tile p_row_sum = mem.row_sum(TensorId::l, p);
      mem.scale_rows(l, rescale);
      mem.add(l, p_row_sum);
      m = std::move(m_new);
    }
    // ... then P_ij = exp(S_ij - m) / l, block by block.
    for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += Bc) {
      const Range cols = col_block(col_begin);
      Tile s = mem.load(S, rows, cols);
      Tile p = mem.exp_minus_row(TensorId::P, s, m);
      mem.divide_rows(p, l);
      mem.store(P, rows, cols, p);
    }
    Tile lse = mem.log_sum_exp(TensorId::LSE, m, l);
    mem.store(x.LSE, rows, lse);
  }

  // Line 3: load P and V by blocks from HBM, compute O = PV, write O.
  for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {
    const Range rows = row_block(row_begin);
    mem.mark_line(3);
    Tile o = mem.zeros(TensorId::O, rows, {0, head.head_dim_v});
    for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += Bc) {
      const Range cols = col_block(col_begin);
      Tile p = mem.load(P, rows, cols);
      mem.apply_dropout(p, head);
      Tile v = mem.load(x.V, cols);
      mem.multiply_add(o, p, Transpose::no, v, Transpose::no);
    }
    mem.store(x.O, rows, o);
  }
  mem.mark_line(4);  // line 4: return O
}

// Its pseudocode (pseudocode.hpp), the lines it marks.
inline const Pseudocode& standard_attention_pseudocode() {
  static const Pseudocode code{"Standard attention (FA1 Algorithm 0): S and P go through HBM",
       {{0, "in HBM: Q, K, V (N x d)"},
        {1, "load Q, K by blocks; S = tau Q K^T (masked); write S to HBM"},
        {2, "read S by blocks: row max m, sum l; read S again; write P = exp(S - m) / l (and LSE)"},
        {3, "load P, V by blocks; O = P V; write O to HBM"},
        {4, "return O"}}};
  return code;
}

}  // namespace flashlab
