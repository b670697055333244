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
// SRAM: line 2 holds block_rows full rows of S and P (2 * Br * seqlen_k elements); the other
// lines hold Br x Bc tiles.
#pragma once

#include <algorithm>

#include "tile_memory.hpp"
#include "tiling.hpp"

namespace flashlab {

struct StandardTiling {
  int block_rows = 64;  // query rows per block
  int block_cols = 64;  // keys per block

  void validate() const {
    require_block_size("block_rows", block_rows);
    require_block_size("block_cols", block_cols);
  }
};

template <class Memory>
void standard_attention(Memory& mem, const HeadProblem& head, const StandardTiling& tiling,
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
    Tile s = mem.load(S, rows);
    Tile m = mem.row_max(TensorId::m, s);
    Tile p = mem.exp_minus_row(TensorId::P, s, m);  // a fully masked row gives zeros
    Tile l = mem.row_sum(TensorId::l, p);
    mem.divide_rows(p, l);
    mem.store(P, rows, p);
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

}  // namespace flashlab
