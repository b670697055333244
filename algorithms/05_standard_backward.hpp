// Standard attention backward pass (Dao et al. 2022, FA1 Algorithm 3): every N x N matrix
// (P, dP, dS) goes through HBM.
//
//   line 1: dV = P^T dO               P, dO read by blocks, dV written
//   line 2: dP = dO V^T               dO, V read by blocks, dP written to HBM
//   line 3: dS = P * (dP - rowsum(P * dP))    P, dP read (twice by blocks when a row spans
//                                             several key blocks), dS written to HBM
//   line 4: dQ = dS K                 dS, K read by blocks, dQ written
//   line 5: dK = dS^T Q               dS, Q read by blocks, dK written
//
// Algorithm 3 requires P in HBM: the standard forward pass (Algorithm 0) wrote it there. This
// file matches that: standard_backward() takes P as an input in HBM and never recomputes it.
// The forward schedules of this project save only O and LSE, so standard_forward_residuals()
// regenerates what Algorithm 0 would have left in HBM (S and P, lines 1-2 of Algorithm 0, with
// P = exp(S - LSE)); run_standard_backward() counts that pass with the forward, apart from the
// backward's counters.
//
// Every intermediate is rounded to the problem's dtype when it is stored (P, dP, dS, like the
// outputs), so in bf16/fp16 this is the naive implementation in the same precision that the
// low-precision rule of the tests measures the tiled schedules against.
//
// Beyond the pseudocode: dropout regenerates the mask Z from the Philox counter: dV uses P * Z
// (line 1) and dP = (dO V^T) * Z (line 2), so rowsum(P * dP) = rowsum(dO * O) still. The softcap
// chains dS through its derivative at line 3, from the scaled scores S that Algorithm 0 wrote
// (read only when a softcap is set). S = scale Q K^T, so dQ and dK carry the scale.
// GQA/MQA: this schedule handles one query head; run_backward() sums dK, dV over the group.
#pragma once

#include <algorithm>
#include <cstdint>

#include "pseudocode.hpp"
#include "02_standard_attention.hpp"  // BlockTiling
#include "run_backward.hpp"
#include "tile_memory.hpp"

namespace flashlab {

// The blocks of Algorithm 0's (02_standard_attention.hpp): query rows x keys of the N x N
// matrices moved by every line (and the residual pass). Line 3's row sum D_i needs the full row:
// when a row spans more than one key block (Bc < seqlen_k) it reads P and dP twice, by blocks,
// first for D_i, then to write dS_ij; one block per row (Bc >= seqlen_k) reads them once.

// Its working set (tiling.hpp: WorkingSetDims): the largest of its five lines.
inline std::int64_t standard_backward_working_set_bytes(const Problem& p, int block_rows, int block_cols) {
  const WorkingSetDims t(p, block_rows, block_cols);
  const CheckedInt64 r = t.r, c = t.c, d = t.d, dv = t.dv, e = t.e, f = t.f;
  return std::max({e * (c * dv + r * c + r * dv),            // line 1: dV_j, P_ij, dO_i
                   e * (r * dv + c * dv + r * c),            // line 2: dO_i, V_j, dP_ij
                   c >= t.nk ? 3 * e * r * t.nk + f * r      // line 3, whole rows of P, dP, dS; D
                             : std::max(3 * e * r * c + f * r,       // or blocks P_ij, dP_ij, dS_ij; D
                                        2 * e * r * c + 2 * f * r),  // (first pass: P_ij, dP_ij; D, its partial)
                   e * (r * d + r * c + c * d)})             // lines 4 and 5: dQ_i, dS_ij, K_j
      .value();
}

// The N x N matrices of one head in HBM. S is only needed (and only allocated) with a softcap.
struct StandardBackwardResiduals {
  HbmMatrix P;  // softmax probabilities, before dropout (the forward's P)
  HbmMatrix S;  // scaled scores scale Q K^T, before softcap, ALiBi and the mask
};

// What Algorithm 0 (lines 1-2) leaves in HBM, regenerated from Q, K and the saved LSE:
// S = scale Q K^T, P = exp(MASK(mods(S)) - LSE).
template <class Memory>
void standard_forward_residuals(Memory& mem, const HeadProblem& head, const BlockTiling& tiling,
                                const HeadTensors& x, const StandardBackwardResiduals& residuals) {
  tiling.validate();
  const int Br = tiling.block_rows, Bc = tiling.block_cols;
  for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {
    const Range rows{row_begin, std::min(Br, head.seqlen_q - row_begin)};
    Tile q = mem.load(x.Q, rows);
    Tile lse = mem.load(x.LSE, rows);
    for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += Bc) {
      const Range cols{col_begin, std::min(Bc, head.seqlen_k - col_begin)};
      Tile k = mem.load(x.K, cols);
      Tile s = mem.matmul_nt(TensorId::S, q, k, head.scale);
      if (head.softcap > 0) mem.store(residuals.S, rows, cols, s);
      mem.apply_score_mods(s, head);
      Tile p = mem.exp_minus_row(TensorId::P, s, lse);
      mem.store(residuals.P, rows, cols, p);
    }
  }
}

template <class Memory>
void standard_backward(Memory& mem, const HeadProblem& head, const BlockTiling& tiling, const HeadTensors& x,
                       const StandardBackwardResiduals& residuals) {
  tiling.validate();
  const int Br = tiling.block_rows, Bc = tiling.block_cols;
  const int d = head.head_dim, d_v = head.head_dim_v;
  auto row_block = [&](int begin) { return Range{begin, std::min(Br, head.seqlen_q - begin)}; };
  auto col_block = [&](int begin) { return Range{begin, std::min(Bc, head.seqlen_k - begin)}; };
  HbmScratch scratch(Memory::with_data);
  const HbmMatrix dP = scratch.matrix(TensorId::dP, head.dtype, head.seqlen_q, head.seqlen_k);
  const HbmMatrix dS = scratch.matrix(TensorId::dS, head.dtype, head.seqlen_q, head.seqlen_k);

  // Line 1: load P, dO by blocks, compute dV = (P * Z)^T dO, write dV to HBM.
  mem.mark_line(1);
  for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += Bc) {
    const Range cols = col_block(col_begin);
    Tile dv_block = mem.zeros(TensorId::dV, cols, {0, d_v});
    for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {
      const Range rows = row_block(row_begin);
      Tile p = mem.load(residuals.P, rows, cols);
      mem.apply_dropout(p, head);
      Tile d_out = mem.load(x.dO, rows);
      mem.multiply_add(dv_block, p, Transpose::yes, d_out, Transpose::no);
    }
    write_key_gradient(mem, x, x.dV, cols, dv_block);
  }

  // Line 2: load dO, V by blocks, compute dP = (dO V^T) * Z, write dP to HBM.
  mem.mark_line(2);
  for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {
    const Range rows = row_block(row_begin);
    Tile d_out = mem.load(x.dO, rows);
    for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += Bc) {
      const Range cols = col_block(col_begin);
      Tile v = mem.load(x.V, cols);
      Tile dp = mem.matmul_nt(TensorId::dP, d_out, v);
      mem.apply_dropout(dp, head);
      mem.store(dP, rows, cols, dp);
    }
  }

  // Line 3: read P, dP, compute dS_ij = P_ij (dP_ij - sum_l P_il dP_il), write dS.
  mem.mark_line(3);
  for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {
    const Range rows = row_block(row_begin);
    if (Bc >= head.seqlen_k) {  // one block holds the whole row
      Tile p = mem.load(residuals.P, rows);
      Tile dp = mem.load(dP, rows);
      Tile d_row = mem.row_dot(TensorId::D, p, dp);
      Tile ds = mem.softmax_backward(TensorId::dS, p, dp, d_row);
      if (head.softcap > 0) {
        Tile s_scaled = mem.load(residuals.S, rows);
        mem.chain_score_mods(ds, s_scaled, head);
      }
      mem.store(dS, rows, ds);
      continue;
    }
    // Row-block form: D_i = sum_j rowsum(P_ij * dP_ij) over the key blocks first ...
    Tile d_row = mem.vector(TensorId::D, rows, 0.0f);
    for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += Bc) {
      const Range cols = col_block(col_begin);
      Tile p = mem.load(residuals.P, rows, cols);
      Tile dp = mem.load(dP, rows, cols);
      Tile partial = mem.row_dot(TensorId::D, p, dp);
      mem.add(d_row, partial);
    }
    // ... then dS_ij block by block.
    for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += Bc) {
      const Range cols = col_block(col_begin);
      Tile p = mem.load(residuals.P, rows, cols);
      Tile dp = mem.load(dP, rows, cols);
      Tile ds = mem.softmax_backward(TensorId::dS, p, dp, d_row);
      if (head.softcap > 0) {
        Tile s_scaled = mem.load(residuals.S, rows, cols);
        mem.chain_score_mods(ds, s_scaled, head);
      }
      mem.store(dS, rows, cols, ds);
    }
  }

  // Line 4: load dS, K by blocks, compute dQ = scale dS K, write dQ to HBM.
  mem.mark_line(4);
  for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {
    const Range rows = row_block(row_begin);
    Tile dq = mem.zeros(TensorId::dQ, rows, {0, d});
    for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += Bc) {
      const Range cols = col_block(col_begin);
      Tile ds = mem.load(dS, rows, cols);
      Tile k = mem.load(x.K, cols);
      mem.multiply_add(dq, ds, Transpose::no, k, Transpose::no, head.scale);
    }
    mem.store(x.dQ, rows, dq);
  }

  // Line 5: load dS, Q by blocks, compute dK = scale dS^T Q, write dK to HBM.
  mem.mark_line(5);
  for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += Bc) {
    const Range cols = col_block(col_begin);
    Tile dk = mem.zeros(TensorId::dK, cols, {0, d});
    for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {
      const Range rows = row_block(row_begin);
      Tile ds = mem.load(dS, rows, cols);
      Tile q = mem.load(x.Q, rows);
      mem.multiply_add(dk, ds, Transpose::yes, q, Transpose::no, head.scale);
    }
    write_key_gradient(mem, x, x.dK, cols, dk);
  }
}

// One head: the residual pass (counted into *forward_counters when given, not into mem), then
// Algorithm 3.
template <class Memory>
void standard_backward_from_lse(Memory& mem, const HeadProblem& head, const BlockTiling& tiling,
                                const HeadTensors& x, Counters* forward_counters = nullptr) {
  HbmScratch scratch(Memory::with_data);
  StandardBackwardResiduals residuals;
  residuals.P = scratch.matrix(TensorId::P, head.dtype, head.seqlen_q, head.seqlen_k);
  if (head.softcap > 0) residuals.S = scratch.matrix(TensorId::S, head.dtype, head.seqlen_q, head.seqlen_k);
  // The residual pass stands for Algorithm 0's forward pass, which this run does not count: it
  // is not held to the backward's M either (its own working set is standard attention's, four
  // tiles Q_i, K_j, S_ij, P_ij where Algorithm 3's lines hold three).
  MemoryConfig forward_config = mem.config();
  forward_config.sram_capacity_bytes = 0;
  Memory forward_side(forward_config);
  standard_forward_residuals(forward_side, head, tiling, x, residuals);
  if (forward_counters) *forward_counters += forward_side.counters();
  standard_backward(mem, head, tiling, x, residuals);
}

// The whole problem: every sequence and head, GQA/MQA reduction included (run_backward.hpp).
// tensors == nullptr runs shape-only.
template <class Memory = DataMemory>
Counters run_standard_backward(const Problem& problem, AttentionTensors* tensors, std::int64_t sram_capacity_bytes,
                               const BlockTiling& tiling) {
  tiling.validate();
  return run_backward<Memory>(problem, tensors, sram_capacity_bytes,
                              [&](Memory& mem, const HeadProblem& head, const HeadTensors& x) {
                                standard_backward_from_lse(mem, head, tiling, x);
                              });
}

// Its pseudocode (pseudocode.hpp), the lines it marks.
inline const Pseudocode& standard_backward_pseudocode() {
  static const Pseudocode code{"Standard attention backward (FA1 Algorithm 3): P, dP, dS go through HBM",
       {{0, "in HBM: Q, K, V, dO and P (N x N, from the forward pass)"},
        {1, "load P, dO by blocks; dV = P^T dO; write dV to HBM"},
        {2, "load dO, V by blocks; dP = dO V^T; write dP to HBM"},
        {3, "read P, dP by blocks: D = rowsum(P * dP); again: dS = P * (dP - D); write dS"},
        {4, "load dS, K by blocks; dQ = dS K; write dQ to HBM"},
        {5, "load dS, Q by blocks; dK = dS^T Q; write dK to HBM"},
        {6, "return dQ, dK, dV"}}};
  return code;
}

}  // namespace flashlab
