// FlashAttention-2 backward pass (Dao 2023, Algorithm 2).
//
// A preprocessing pass computes D = rowsum(dO * O) once and writes it to HBM (line 4). Then the
// outer loop runs over key/value blocks K_j, V_j: dK_j and dV_j stay on chip for the whole inner
// loop over query blocks and are written once (line 18). P is recomputed from the saved
// log-sum-exp, P = exp(S - L) (line 11), so no N x N matrix ever reaches HBM. dQ_i is
// read, updated and written back in HBM at every inner step (line 15; or added with atomics,
// DqUpdate below), accumulated in fp32 in
// increasing key-block order, so the result is deterministic (a GPU kernel runs the key blocks
// in parallel and needs atomics or a fixed order for the same).
//
// Beyond the paper's pseudocode, as in the flash-attention implementation:
//   - blocks the mask hides entirely (causal, window, block sparsity) are skipped, not masked;
//     a key block no query sees writes dK_j = dV_j = 0 without loading K_j, V_j;
//   - softcap, ALiBi and the mask are applied to S as in the forward pass (line 10), and dS is
//     chained through the softcap's derivative (line 14);
//   - dropout: the mask Z is regenerated from the Philox counter; dV uses P * Z (line 12) and
//     dP = (dO V^T) * Z (line 13);
//   - the scale: S = scale Q K^T, so dQ and dK carry the scale (lines 15 and 16);
//   - with a low-precision dtype dQ is accumulated in an fp32 HBM buffer and converted once at
//     the end; with fp32 the output itself is the accumulator.
// GQA/MQA: this schedule handles one query head; run_backward() sums dK, dV over the group.
#pragma once

#include <algorithm>
#include <vector>

#include "pseudocode.hpp"
#include "04_fa2_forward.hpp"  // BlockTiling
#include "run_backward.hpp"
#include "tile_memory.hpp"

namespace flashlab {

// Line 15's update of the fp32 dQ accumulator in HBM:
//   read_modify_write - load dQ_i, add scale dS K_j on chip, store it (the paper's "write dQ_i
//                       <- dQ_i + tau dS_ij K_j to HBM"; the reads are counted): fa2_backward;
//   atomic            - compute scale dS K_j on chip and add it in HBM with atomics, which the
//                       L2 cache performs, so dQ_i is never read (as the project's FA2 kernel,
//                       kernels/02_fa2_sm80/backward_kernel.cuh): fa2_backward_atomic.
// Both add the key blocks in increasing order here, so both give the same dQ.
enum class DqUpdate { read_modify_write, atomic };

// Its working set, either update (tiling.hpp: WorkingSetDims): K_j, V_j, dK_j, dV_j; Q_i, dO_i;
// dQ_i (fp32; with atomics, its partial sum); S, P, dP, dS; LSE, D.
inline std::int64_t fa2_backward_working_set_bytes(const Problem& p, int block_rows, int block_cols) {
  const WorkingSetDims t(p, block_rows, block_cols);
  return (t.e * (2 * t.c * (t.d + t.dv) + t.r * t.d + t.r * t.dv + 4 * t.r * t.c) + t.f * t.r * t.d + 2 * t.f * t.r).value();
}

template <class Memory>
void fa2_backward(Memory& mem, const HeadProblem& head, const BlockTiling& tiling, const HeadTensors& x,
                  DqUpdate dq_update = DqUpdate::read_modify_write) {
  tiling.validate();
  // Lines 1-2: Q, O, dO, L in blocks of Br rows, K, V in blocks of Bc rows (views of HBM; the
  // last block is shorter when the size does not divide the sequence).
  const int Br = tiling.block_rows, Bc = tiling.block_cols;
  auto row_block = [&](int begin) { return Range{begin, std::min(Br, head.seqlen_q - begin)}; };
  auto col_block = [&](int begin) { return Range{begin, std::min(Bc, head.seqlen_k - begin)}; };
  const int d = head.head_dim, d_v = head.head_dim_v;
  HbmScratch scratch(Memory::with_data);

  // Line 3: dQ = 0 in HBM (fp32).
  mem.mark_line(3);
  const HbmMatrix dQ = fp32_gradient_accumulator(scratch, x.dQ);
  zero_gradient(mem, dQ, Br);

  // Line 4: D = rowsum(dO * O), written to HBM.
  mem.mark_line(4);
  const HbmMatrix D = scratch.matrix(TensorId::D, DType::fp32, head.seqlen_q, 1);
  for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {
    const Range rows = row_block(row_begin);
    Tile d_out = mem.load(x.dO, rows);
    Tile o = mem.load(x.O, rows);
    Tile d_row = mem.row_dot(TensorId::D, d_out, o);
    mem.store(D, rows, d_row);
  }

  struct VisibleBlock {
    Range rows;
    bool partial;
  };
  std::vector<VisibleBlock> visible_rows;
  for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += Bc) {  // line 5
    const Range cols = col_block(col_begin);
    visible_rows.clear();
    for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {
      const Range rows = row_block(row_begin);
      const auto coverage = head.coverage(rows.begin, rows.end(), cols.begin, cols.end());
      if (coverage != HeadProblem::BlockCoverage::empty) {
        visible_rows.push_back({rows, coverage == HeadProblem::BlockCoverage::partial});
      }
    }
    if (visible_rows.empty()) {  // no query sees these keys: their gradients are zero
      mem.mark_line(18);
      zero_key_gradients(mem, x, cols);
      continue;
    }
    mem.mark_line(6);
    Tile k = mem.load(x.K, cols);  // line 6
    Tile v = mem.load(x.V, cols);
    mem.mark_line(7);
    Tile dk = mem.zeros(TensorId::dK, cols, {0, d});  // line 7
    Tile dv = mem.zeros(TensorId::dV, cols, {0, d_v});
    for (const VisibleBlock& block : visible_rows) {  // line 8, masked blocks skipped
      const Range rows = block.rows;
      // Line 9: the paper also lists O_i, but O enters only through D (line 4), and dQ_i is
      // loaded where it is updated (line 15).
      mem.mark_line(9);
      Tile q = mem.load(x.Q, rows);
      Tile d_out = mem.load(x.dO, rows);
      Tile lse = mem.load(x.LSE, rows);
      Tile d_row = mem.load(D, rows);

      mem.mark_line(10);
      Tile s = mem.matmul_nt(TensorId::S, q, k, head.scale);  // line 10: S = scale Q_i K_j^T
      Tile s_scaled;  // the scores before the softcap, for its chain rule at line 14
      if (head.softcap > 0) s_scaled = mem.copy(TensorId::S, s);
      if (block.partial || head.modifies_scores()) mem.apply_score_mods(s, head);

      mem.mark_line(11);
      Tile p = mem.exp_minus_row(TensorId::P, s, lse);  // line 11: P = exp(S - L)

      mem.mark_line(12);  // line 12: dV_j += (P * Z)^T dO_i
      if (head.dropout.probability > 0) {
        Tile p_dropped = mem.copy(TensorId::P, p);
        mem.apply_dropout(p_dropped, head);
        mem.multiply_add(dv, p_dropped, Transpose::yes, d_out, Transpose::no);
      } else {
        mem.multiply_add(dv, p, Transpose::yes, d_out, Transpose::no);
      }

      mem.mark_line(13);
      Tile dp = mem.matmul_nt(TensorId::dP, d_out, v);  // line 13: dP = (dO_i V_j^T) * Z
      mem.apply_dropout(dp, head);

      mem.mark_line(14);
      Tile ds = mem.softmax_backward(TensorId::dS, p, dp, d_row);  // line 14: dS = P * (dP - D_i)
      if (head.softcap > 0) mem.chain_score_mods(ds, s_scaled, head);

      mem.mark_line(15);  // line 15: dQ_i += scale dS K_j in HBM
      if (dq_update == DqUpdate::read_modify_write) {
        Tile dq = mem.load(dQ, rows);
        mem.multiply_add(dq, ds, Transpose::no, k, Transpose::no, head.scale);
        mem.store(dQ, rows, dq);
      } else {
        Tile dq = mem.fp32_zeros(TensorId::dQ, rows, {0, d});
        mem.multiply_add(dq, ds, Transpose::no, k, Transpose::no, head.scale);
        mem.atomic_add(dQ, rows, dq);
      }

      mem.mark_line(16);  // line 16: dK_j += scale dS^T Q_i
      mem.multiply_add(dk, ds, Transpose::yes, q, Transpose::no, head.scale);
    }
    mem.mark_line(18);
    write_key_gradient(mem, x, x.dK, cols, dk);  // line 18
    write_key_gradient(mem, x, x.dV, cols, dv);
  }

  mem.mark_line(20);
  convert_gradient(mem, dQ, x.dQ, Br);  // dQ in the output's dtype
}

// The whole problem: every sequence and head, GQA/MQA reduction included (run_backward.hpp).
// tensors == nullptr runs shape-only.
template <class Memory = DataMemory>
Counters run_fa2_backward(const Problem& problem, AttentionTensors* tensors, std::int64_t sram_capacity_bytes,
                          const BlockTiling& tiling) {
  tiling.validate();
  return run_backward<Memory>(problem, tensors, sram_capacity_bytes,
                              [&](Memory& mem, const HeadProblem& head, const HeadTensors& x) {
                                fa2_backward(mem, head, tiling, x);
                              });
}

// Its pseudocode (pseudocode.hpp), the lines it marks.
inline const Pseudocode& fa2_backward_pseudocode() {
  static const Pseudocode code{"FlashAttention-2 backward (FA2 Algorithm 2)",
       {{0, "in HBM: Q, K, V, O, dO and the log-sum-exp L"},
        {1, "split Q into Tr blocks of Br rows; K, V into Tc blocks of Bc rows"},
        {2, "split O, dO into Tr blocks, L into Tr blocks"},
        {3, "dQ = 0 in HBM, split into Tr blocks; split dK, dV into Tc blocks"},
        {4, "D = rowsum(dO * O); write D to HBM, split into Tr blocks"},
        {5, "for j = 1 .. Tc:"},
        {6, "  load K_j, V_j from HBM to SRAM"},
        {7, "  on chip: dK_j = 0, dV_j = 0"},
        {8, "  for i = 1 .. Tr:   (blocks hidden by the mask are skipped)"},
        {9, "    load Q_i, dO_i, L_i, D_i from HBM to SRAM"},
        {10, "    on chip: S_ij = tau Q_i K_j^T (then the mask)"},
        {11, "    on chip: P_ij = exp(S_ij - L_i)"},
        {12, "    on chip: dV_j += P_ij^T dO_i"},
        {13, "    on chip: dP_ij = dO_i V_j^T"},
        {14, "    on chip: dS_ij = P_ij * (dP_ij - D_i)"},
        {15, "    load dQ_i; dQ_i += tau dS_ij K_j; write dQ_i to HBM"},
        {16, "    on chip: dK_j += tau dS_ij^T Q_i"},
        {17, "  end for"},
        {18, "  write dK_j, dV_j to HBM"},
        {19, "end for"},
        {20, "return dQ, dK, dV"}}};
  return code;
}

// fa2_backward_atomic's pseudocode: line 15 adds dQ_i by atomics.
inline const Pseudocode& fa2_backward_atomic_pseudocode() {
  static const Pseudocode code = fa2_backward_pseudocode().with_line(
      "FlashAttention-2 backward, dQ by atomics (FA2 Algorithm 2, as the FA2 kernel)", 15,
      "    dQ_i += tau dS_ij K_j by atomic adds in HBM (dQ_i never read)");
  return code;
}

}  // namespace flashlab
