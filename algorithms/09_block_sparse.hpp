// Block-sparse FlashAttention forward pass (Dao et al. 2022, Algorithm 5).
//
// FA1 Algorithm 2 with a block mask M~ in {0, 1}^{Tr x Tc}: the inner step (lines 9-16, the same
// code as 03_fa1_forward.hpp) runs only for the blocks with M~_ij != 0, so the IO and the FLOPs
// scale with the fraction s of kept blocks (FA1 Proposition 4: Theta(Nd + N^2 d^2 M^-1 s)).
//
// M~_ij is derived from the problem: a tile is kept iff any of its scores is visible, i.e.
// HeadProblem::coverage is not empty. That includes problem.block_sparsity (whose granularity may
// differ from the tiling; with block_sparse_tiling() the tiles are exactly its blocks) and treats
// causal and sliding-window masks as the block masks they also are. Kept tiles that are only
// partly visible are masked element-wise (line 11).
//
// Two consequences of skipping, each handled where the paper is silent:
//  - K_j and V_j are loaded (line 6) only when column j has a kept block, so nothing of a
//    skipped column is read.
//  - A query block's last visit is its last kept block: that step writes O_i in the problem's
//    dtype and LSE (03's precision note). A query block with no kept block at all gets its final
//    O_i = 0 and LSE = -inf in line 2 and is never touched again.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "pseudocode.hpp"
#include "03_fa1_forward.hpp"
#include "tile_memory.hpp"

namespace flashlab {

// FA1 Algorithm 5 numbers (its block sizes are an input, not a line): 2 initialise O, l, m,
// 6 load K_j V_j, 8 "if M_ij != 0", 9 load Q_i O_i l_i m_i, 10 S_ij, 11 MASK, 12 m~ P~ l~,
// 13 m_new l_new, 14 dropout, 15 write O_i, 16 write l_i m_i, 20 return.
inline constexpr Fa1Lines kFa1Algorithm5Lines{2, 6, 9, 10, 11, 12, 13, 14, 15, 16, 20, 8};
// FA1 Algorithm 1 with hidden blocks skipped at its line 7 ("for 1 <= i <= Tr"): the lines of
// Algorithm 1 (03_fa1_forward.hpp), the skip marked at 7.
inline constexpr Fa1Lines kFa1Algorithm1SkippingLines{2, 6, 8, 9, 9, 10, 11, 12, 12, 13, 16, 7};

// Tiles equal to the problem's sparsity blocks (the paper's M~ at the granularity Br x Bc), or
// `fallback` when the problem has no block sparsity.
inline BlockTiling block_sparse_tiling(const Problem& problem, BlockTiling fallback = {}) {
  if (!problem.block_sparsity.enabled()) return fallback;
  return {problem.block_sparsity.block_rows, problem.block_sparsity.block_cols};
}

template <class Memory>
void fa1_block_sparse_forward(Memory& mem, const HeadProblem& head, const BlockTiling& tiling,
                              const HeadTensors& x, const Fa1Lines& line = kFa1Algorithm5Lines) {
  tiling.validate();  // the block sizes Br, Bc (an input of Algorithm 5)
  const int Br = tiling.block_rows, Bc = tiling.block_cols;
  const int row_blocks = (head.seqlen_q + Br - 1) / Br,
            col_blocks = (head.seqlen_k + Bc - 1) / Bc;  // lines 3-4
  const auto row_block = [&](int i) { return Range{i * Br, std::min(Br, head.seqlen_q - i * Br)}; };
  const auto col_block = [&](int j) { return Range{j * Bc, std::min(Bc, head.seqlen_k - j * Bc)}; };

  // The block mask M~ (an input of the algorithm, like the paper's: no HBM traffic is counted for
  // it), each column's "any kept block" and each query block's last kept column.
  std::vector<std::uint8_t> kept(static_cast<std::size_t>(row_blocks) * col_blocks);
  std::vector<std::uint8_t> column_has_kept(col_blocks, 0);
  std::vector<int> last_kept_column(row_blocks, -1);
  for (int i = 0; i < row_blocks; ++i) {
    for (int j = 0; j < col_blocks; ++j) {
      const Range rows = row_block(i), cols = col_block(j);
      const bool keep = head.coverage(rows.begin, rows.end(), cols.begin, cols.end()) !=
                        HeadProblem::BlockCoverage::empty;
      kept[static_cast<std::size_t>(i) * col_blocks + j] = keep;
      if (keep) column_has_kept[j] = 1, last_kept_column[i] = j;
    }
  }

  HbmScratch scratch(Memory::with_data);
  const Fa1HbmState state = fa1_hbm_state(scratch, head);
  mem.mark_line(line.initialize);
  for (int i = 0; i < row_blocks; ++i) {  // line 2: O = 0, l = 0, m = -inf in HBM
    if (last_kept_column[i] >= 0) {
      fa1_initialize_block(mem, state, row_block(i), head.head_dim_v);
    } else {  // no kept block: these are already the final outputs of a fully masked block
      Tile o = mem.zeros(TensorId::O, row_block(i), {0, head.head_dim_v});
      Tile lse = mem.vector(TensorId::LSE, row_block(i), kNegInf);
      mem.store(x.O, row_block(i), o);
      mem.store(x.LSE, row_block(i), lse);
    }
  }

  for (int j = 0; j < col_blocks; ++j) {  // line 5: for 1 <= j <= Tc
    if (!column_has_kept[j]) continue;    // nothing of column j is needed: not even loaded
    mem.mark_line(line.load_key_value);
    Tile k = mem.load(x.K, col_block(j));  // line 6: load K_j, V_j
    Tile v = mem.load(x.V, col_block(j));
    for (int i = 0; i < row_blocks; ++i) {  // line 7: for 1 <= i <= Tr
      mem.mark_line(line.skip_test);
      if (!kept[static_cast<std::size_t>(i) * col_blocks + j]) continue;  // line 8: if M~_ij != 0
      fa1_inner_step(mem, head, x, state, k, v, row_block(i), j == last_kept_column[i],
                     line);  // 9-16
    }
  }
  mem.mark_line(line.finish);  // line 20: return O, LSE
}

// FA1 Algorithm 1 that skips the blocks a causal or window mask hides instead of masking them,
// as the project's FA1 kernel does (kernels/01_fa1_sm75/forward_kernel.cuh): the loop of
// Algorithm 5 with M~_ij = "block (i, j) has a visible score". Without a mask (and without block
// sparsity) it visits every block and counts as fa1_forward.
template <class Memory>
void fa1_forward_skipping(Memory& mem, const HeadProblem& head, const BlockTiling& tiling, const HeadTensors& x) {
  fa1_block_sparse_forward(mem, head, tiling, x, kFa1Algorithm1SkippingLines);
}

// Its pseudocode (pseudocode.hpp), the lines it marks.
inline const Pseudocode& block_sparse_pseudocode() {
  static const Pseudocode code{"Block-sparse FlashAttention (FA1 Algorithm 5)",
       {{0, "in HBM: Q, K, V; block sizes Br, Bc; block mask M~ (Tr x Tc)"},
        {1, "initialise the dropout generator state R"},
        {2, "O = 0, l = 0, m = -inf in HBM"},
        {3, "split Q into Tr blocks; K, V into Tc blocks"},
        {4, "split O, l, m into Tr blocks"},
        {5, "for j = 1 .. Tc:"},
        {6, "  load K_j, V_j from HBM to SRAM"},
        {7, "  for i = 1 .. Tr:"},
        {8, "    if M~_ij != 0:   (otherwise the tile is skipped)"},
        {9, "      load Q_i, O_i, l_i, m_i from HBM to SRAM"},
        {10, "      on chip: S_ij = tau Q_i K_j^T"},
        {11, "      on chip: S_ij = MASK(S_ij)"},
        {12, "      on chip: m~ = rowmax(S_ij), P~ = exp(S_ij - m~), l~ = rowsum(P~)"},
        {13, "      on chip: m_new = max(m_i, m~), l_new = e^(m_i - m_new) l_i + e^(m~ - m_new) l~"},
        {14, "      on chip: P~ = dropout(P~)"},
        {15, "      write O_i = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~ - m_new) P~ V_j)"},
        {16, "      write l_i = l_new, m_i = m_new to HBM"},
        {17, "    end if"},
        {18, "  end for"},
        {19, "end for"},
        {20, "return O"}}};
  return code;
}

// fa1_skip's pseudocode: FA1's (03_fa1_forward.hpp) with line 7 skipping the hidden blocks.
inline const Pseudocode& fa1_skipping_pseudocode() {
  static const Pseudocode code = fa1_forward_pseudocode().with_line(
      "FlashAttention forward, hidden blocks skipped (FA1 Algorithm 1, as the FA1 kernel)", 7,
      "  for i = 1 .. Tr:   (blocks hidden by the mask are skipped)");
  return code;
}

}  // namespace flashlab
