// FlashAttention backward pass (Dao et al. 2022, FA1 Algorithm 4), line by line.
//
// The outer loop runs over key/value blocks K_j, V_j, whose gradients dK_j, dV_j accumulate on
// chip; the inner loop runs over query blocks and, at every step, loads Q_i, O_i, dO_i, dQ_i and
// the forward's softmax statistics l_i, m_i (line 10), recomputes P_ij = diag(l_i)^-1
// exp(S_ij - m_i) (line 13) and D_i = rowsum(dO_i * O_i) (line 19), and writes dQ_i back to HBM
// (line 21). Every block is visited, as in the paper: a block the mask hides is masked (line 12),
// not skipped.
// (FA2, 07_fa2_backward.hpp, computes D once, uses L = m + log l, and skips masked blocks.)
//
// Beyond the pseudocode: softcap and ALiBi are applied with the mask at line 12 and dS is
// chained through the softcap's derivative at line 20; the softmax scale is tau = head.scale.
// dQ is accumulated in HBM in fp32 (the output itself when it is fp32) and rounded once at the
// end, as the reference implementation does.
// GQA/MQA: this schedule handles one query head; run_backward() sums dK, dV over the group.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "pseudocode.hpp"
#include "03_fa1_forward.hpp"  // BlockTiling
#include "run_backward.hpp"    // fp32_gradient_accumulator, zero_gradient, convert_gradient
#include "tile_memory.hpp"

namespace flashlab {

// Block sizes: those of the FA1 forward (03_fa1_forward.hpp), given or from the SRAM size M by
// the paper's rule, fa1_paper_tiling (Algorithm 4, line 2, is Algorithm 1's line 1:
// Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d), M in elements). That rule is right up to a
// constant: at those sizes the backward's working set is a few times M (K_j, V_j, dK_j and dV_j
// alone are 4 Bc d = M elements), so an arena of exactly M bytes overflows; give the arena more
// room or smaller blocks.

// Its working set (tiling.hpp: WorkingSetDims): K_j, V_j, dK_j, dV_j; Q_i, O_i, dO_i; dQ_i (fp32);
// S, P, dP, dS; l, m, D.
inline std::int64_t fa1_backward_working_set_bytes(const Problem& p, int block_rows, int block_cols) {
  const WorkingSetDims t(p, block_rows, block_cols);
  return (t.e * (2 * t.c * (t.d + t.dv) + t.r * t.d + 2 * t.r * t.dv + 4 * t.r * t.c) + t.f * t.r * t.d + 3 * t.f * t.r).value();
}

// The forward's softmax statistics in HBM: row max m and row sum l (FA1 Algorithm 1, line 13).
struct Fa1SoftmaxStatistics {
  HbmMatrix l, m;
};

template <class Memory>
void fa1_backward(Memory& mem, const HeadProblem& head, const BlockTiling& tiling, const HeadTensors& x,
                  const Fa1SoftmaxStatistics& statistics) {
  tiling.validate();
  // Line 1: the RNG state R is the pair (seed, offset) of a counter-based Philox generator: the
  // dropout mask of element (i, j) is regenerated from its counter at lines 14 and 18.
  mem.mark_line(1);
  // Lines 2-4: block sizes (given, or fa1_paper_tiling) and the blocks of Q, K, V, O, dO,
  // l, m (views of HBM, nothing moves).
  const int Br = tiling.block_rows, Bc = tiling.block_cols;
  auto row_block = [&](int begin) { return Range{begin, std::min(Br, head.seqlen_q - begin)}; };
  auto col_block = [&](int begin) { return Range{begin, std::min(Bc, head.seqlen_k - begin)}; };
  const int d = head.head_dim, d_v = head.head_dim_v;
  HbmScratch scratch(Memory::with_data);

  // Line 5: dQ = 0, dK = 0, dV = 0 in HBM (dK and dV are overwritten at line 24 anyway).
  mem.mark_line(5);
  const HbmMatrix dQ = fp32_gradient_accumulator(scratch, x.dQ);
  zero_gradient(mem, dQ, Br);
  for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += Bc) {
    zero_key_gradients(mem, x, col_block(col_begin));
  }

  for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += Bc) {  // line 6
    const Range cols = col_block(col_begin);
    mem.mark_line(7);
    Tile k = mem.load(x.K, cols);  // line 7
    Tile v = mem.load(x.V, cols);
    mem.mark_line(8);
    Tile dk = mem.zeros(TensorId::dK, cols, {0, d});  // line 8
    Tile dv = mem.zeros(TensorId::dV, cols, {0, d_v});
    for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {  // line 9
      const Range rows = row_block(row_begin);
      mem.mark_line(10);  // line 10
      Tile q = mem.load(x.Q, rows);
      Tile o = mem.load(x.O, rows);
      Tile d_out = mem.load(x.dO, rows);
      Tile dq = mem.load(dQ, rows);
      Tile l = mem.load(statistics.l, rows);
      Tile m = mem.load(statistics.m, rows);

      mem.mark_line(11);
      Tile s = mem.matmul_nt(TensorId::S, q, k, head.scale);  // line 11: S = tau Q_i K_j^T
      Tile s_scaled;  // the scores before the softcap, for its chain rule at line 20
      if (head.softcap > 0) s_scaled = mem.copy(TensorId::S, s);
      // Line 12: MASK(S), with softcap and ALiBi. On a block the mask leaves whole and no score
      // modification is set MASK is the identity and is not computed (as in 03_fa1_forward.hpp).
      const auto coverage = head.coverage(rows.begin, rows.end(), cols.begin, cols.end());
      if (coverage != HeadProblem::BlockCoverage::full || head.modifies_scores()) {
        mem.mark_line(12);
        mem.apply_score_mods(s, head);
      }

      mem.mark_line(13);
      Tile p = mem.exp_minus_row(TensorId::P, s, m);  // line 13: P = diag(l)^-1 exp(S - m)
      mem.divide_rows(p, l);

      mem.mark_line(14);  // lines 14-16: dV_j += (P * Z)^T dO_i
      if (head.dropout.probability > 0) {
        Tile p_dropped = mem.copy(TensorId::P, p);
        mem.mark_line(15);
        mem.apply_dropout(p_dropped, head);
        mem.mark_line(16);
        mem.multiply_add(dv, p_dropped, Transpose::yes, d_out, Transpose::no);
      } else {
        mem.mark_line(16);
        mem.multiply_add(dv, p, Transpose::yes, d_out, Transpose::no);
      }

      mem.mark_line(17);
      Tile dp = mem.matmul_nt(TensorId::dP, d_out, v);  // line 17: dP^dropped = dO_i V_j^T
      mem.mark_line(18);
      mem.apply_dropout(dp, head);  // line 18: dP = dP^dropped * Z

      mem.mark_line(19);
      Tile d_row = mem.row_dot(TensorId::D, d_out, o);  // line 19: D_i = rowsum(dO_i * O_i)

      mem.mark_line(20);
      Tile ds = mem.softmax_backward(TensorId::dS, p, dp, d_row);  // line 20: dS = P * (dP - D_i)
      if (head.softcap > 0) mem.chain_score_mods(ds, s_scaled, head);

      mem.mark_line(21);  // line 21: dQ_i += tau dS K_j, written to HBM
      mem.multiply_add(dq, ds, Transpose::no, k, Transpose::no, head.scale);
      mem.store(dQ, rows, dq);

      mem.mark_line(22);  // line 22: dK_j += tau dS^T Q_i
      mem.multiply_add(dk, ds, Transpose::yes, q, Transpose::no, head.scale);
    }
    mem.mark_line(24);
    write_key_gradient(mem, x, x.dK, cols, dk);  // line 24
    write_key_gradient(mem, x, x.dV, cols, dv);
  }

  mem.mark_line(26);
  convert_gradient(mem, dQ, x.dQ, Br);  // dQ in the output's dtype
}

// The statistics l, m of Algorithm 4's input from the log-sum-exp a forward pass saved:
// m = LSE and l = 1 give the same P = diag(l)^-1 exp(S - m) = exp(S - LSE), and a fully masked
// row (LSE = -inf) still gives P = 0. This is a forward-side conversion, not part of Algorithm 4:
// run_fa1_backward() counts it apart.
template <class Memory>
void fa1_statistics_from_lse(Memory& mem, const HbmMatrix& lse, const Fa1SoftmaxStatistics& statistics, int block_rows) {
  for (int row_begin = 0; row_begin < lse.rows; row_begin += block_rows) {
    const Range rows{row_begin, std::min(block_rows, lse.rows - row_begin)};
    Tile lse_block = mem.load(lse, rows);
    Tile m = mem.copy(TensorId::m, lse_block);
    mem.store(statistics.m, rows, m);
    Tile l = mem.vector(TensorId::l, rows, 1.0f);
    mem.store(statistics.l, rows, l);
  }
}

// One head: Algorithm 4 with its l and m derived from the saved LSE (counted into
// *statistics_counters when given, not into mem).
template <class Memory>
void fa1_backward_from_lse(Memory& mem, const HeadProblem& head, const BlockTiling& tiling, const HeadTensors& x,
                           Counters* statistics_counters = nullptr) {
  HbmScratch scratch(Memory::with_data);
  const Fa1SoftmaxStatistics statistics{scratch.matrix(TensorId::l, DType::fp32, head.seqlen_q, 1),
                                        scratch.matrix(TensorId::m, DType::fp32, head.seqlen_q, 1)};
  Memory forward_side(mem.config());
  fa1_statistics_from_lse(forward_side, x.LSE, statistics, tiling.block_rows);
  if (statistics_counters) *statistics_counters += forward_side.counters();
  fa1_backward(mem, head, tiling, x, statistics);
}

// The whole problem: every sequence and head, GQA/MQA reduction included (run_backward.hpp).
// tensors == nullptr runs shape-only.
template <class Memory = DataMemory>
Counters run_fa1_backward(const Problem& problem, AttentionTensors* tensors, std::int64_t sram_capacity_bytes,
                          const BlockTiling& tiling) {
  tiling.validate();
  return run_backward<Memory>(problem, tensors, sram_capacity_bytes,
                              [&](Memory& mem, const HeadProblem& head, const HeadTensors& x) {
                                fa1_backward_from_lse(mem, head, tiling, x);
                              });
}

// Its pseudocode (pseudocode.hpp), the lines it marks.
inline const Pseudocode& fa1_backward_pseudocode() {
  static const Pseudocode code{"FlashAttention backward (FA1 Algorithm 4)",
       {{0, "in HBM: Q, K, V, O, dO; l, m from the forward pass"},
        {1, "set the dropout generator to the forward's state R"},
        {2, "Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d)"},
        {3, "split Q into Tr blocks; K, V into Tc blocks"},
        {4, "split O, dO, l, m into Tr blocks"},
        {5, "dQ = 0, dK = 0, dV = 0 in HBM"},
        {6, "for j = 1 .. Tc:"},
        {7, "  load K_j, V_j from HBM to SRAM"},
        {8, "  on chip: dK~_j = 0, dV~_j = 0"},
        {9, "  for i = 1 .. Tr:"},
        {10, "    load Q_i, O_i, dO_i, dQ_i, l_i, m_i from HBM to SRAM"},
        {11, "    on chip: S_ij = tau Q_i K_j^T"},
        {12, "    on chip: S_ij = MASK(S_ij)"},
        {13, "    on chip: P_ij = diag(l_i)^-1 exp(S_ij - m_i)"},
        {14, "    on chip: dropout mask Z_ij"},
        {15, "    on chip: P_ij^dropped = P_ij * Z_ij"},
        {16, "    on chip: dV~_j += (P_ij^dropped)^T dO_i"},
        {17, "    on chip: dP_ij^dropped = dO_i V_j^T"},
        {18, "    on chip: dP_ij = dP_ij^dropped * Z_ij"},
        {19, "    on chip: D_i = rowsum(dO_i * O_i)"},
        {20, "    on chip: dS_ij = P_ij * (dP_ij - D_i)"},
        {21, "    write dQ_i = dQ_i + tau dS_ij K_j to HBM"},
        {22, "    on chip: dK~_j += tau dS_ij^T Q_i"},
        {23, "  end for"},
        {24, "  write dK_j = dK~_j, dV_j = dV~_j to HBM"},
        {25, "end for"},
        {26, "return dQ, dK, dV"}}};
  return code;
}

}  // namespace flashlab
