// The FA1 rung's forward kernel (FlashAttention, Dao et al. 2022, Algorithm 1), fp16, head dims
// padded to 64 or 128 (ForwardTiling), compute capability 7.5 and newer.
//
// The structure is the paper's: one thread block per (batch, head); the K/V blocks are the outer
// loop (line 5) and the Q blocks the inner loop (line 7); the output O and the softmax statistics
// l and m live in HBM (fp32 workspace) and are read and re-written for every (Q block, K/V block)
// pair (lines 8 and 12-13). Only the last K/V block a Q block sees writes the final O (fp16) and
// LSE. Tensor cores through mma.sync (m16n8k16 on sm_80+, two m16n8k8 on sm_75), fragments
// through ldmatrix, plain loads (no cp.async: Turing has none). Each warp owns 16 query rows of
// a Q block. Causal and window masks skip whole empty blocks.
//
// What this costs against the FA2 rung is the point of keeping it: only batch * heads blocks (a
// few per SM at long sequences), O/l/m traffic to HBM once per K/V block, and no overlap of loads
// with math.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/01_fa1_sm75/forward_tiling.hpp"
#include "kernels/common/attention_params.hpp"
#include "kernels/common/constants.hpp"
#include "kernels/common/conversions.cuh"
#include "kernels/common/reductions.cuh"
#include "kernels/common/sm80.cuh"

namespace flashlab::kernels::fa1 {

struct ForwardParams : AttentionParams {
  int vector_loads;  // 16-byte loads allowed (head_dim, strides multiples of 8, aligned pointers)
  float* o_state;    // HBM state of Algorithm 1: O [rows_q, heads_q, head_dim], m and l [rows_q, heads_q]
  float* m_state;
  float* l_state;
};

// rows x kHeadDim of one head into a padded shared tile, zero-filled past rows_valid / head_dim.
// `thread_index` / `thread_count` pick the threads that share the copy (a warp or the block).
template <int kHeadDim, int kStride>
__device__ void load_rows(__half* shared, const __half* global, std::int64_t row_stride, int rows, int rows_valid,
                          int head_dim, bool vector_loads, int thread_index, int thread_count) {
  if (vector_loads) {
    constexpr int kChunksPerRow = kHeadDim / kChunkElements;
    for (int chunk = thread_index; chunk < rows * kChunksPerRow; chunk += thread_count) {
      const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * kChunkElements;
      uint4 value = make_uint4(0, 0, 0, 0);
      if (row < rows_valid && col < head_dim) value = *reinterpret_cast<const uint4*>(global + row * row_stride + col);
      *reinterpret_cast<uint4*>(shared + row * kStride + col) = value;
    }
  } else {
    for (int index = thread_index; index < rows * kHeadDim; index += thread_count) {
      const int row = index / kHeadDim, col = index % kHeadDim;
      shared[row * kStride + col] =
          (row < rows_valid && col < head_dim) ? global[row * row_stride + col] : __float2half_rn(0.f);
    }
  }
}

template <int kHeadDim>
__global__ void __launch_bounds__(ForwardTiling<kHeadDim>::kWarps * kWarpSize)
    fa1_forward_kernel(const ForwardParams p) {
  using namespace device;
  using Tile = ForwardTiling<kHeadDim>;
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN, kStride = Tile::kRowStride;
  constexpr int kThreads = Tile::kWarps * kWarpSize, kWarpRows = Tile::kRowsPerWarp;
  constexpr int kKSteps = kHeadDim / 16, kNTiles = kBlockN / 8, kDTiles = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  __half* q_shared = reinterpret_cast<__half*>(shared_bytes);
  __half* k_shared = q_shared + kBlockM * kStride;
  __half* v_shared = k_shared + kBlockN * kStride;
  static_assert((kBlockM + 2 * kBlockN) * kStride * sizeof(__half) == Tile::kSharedBytes,
                "Q, K and V tiles fill the tiling's shared memory");

  const int head = blockIdx.x, batch = blockIdx.y, kv_head = head / p.group_size;
  const SequenceView seq = sequence_view(p, batch);
  const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k;
  const __half* q = p.q.as<const __half>() + seq.q_start + head * p.q.head_stride;
  const __half* k = p.k.as<const __half>() + seq.k_start + kv_head * p.k.head_stride;
  const __half* v = p.v.as<const __half>() + seq.v_start + kv_head * p.v.head_stride;
  __half* o = p.o.as<__half>() + seq.o_start + head * p.o.head_stride;
  float* lse = p.lse.as<float>() + seq.lse_start + head * p.lse.head_stride;
  // The row of the [rows_q, heads_q] state arrays (rows fit an int, as Problem::total_rows_q).
  const int first_row_q = static_cast<int>(seq.first_row_q);
  auto state_index = [&](int row) { return static_cast<std::int64_t>(first_row_q + row) * p.heads_q + head; };

  const MaskRule mask = mask_rule(p, seq);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  const int m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;

  // Line 2: O = 0, l = 0, m = -inf in HBM.
  for (int index = threadIdx.x; index < seqlen_q * p.head_dim; index += kThreads) {
    const int row = index / p.head_dim, col = index % p.head_dim;
    p.o_state[state_index(row) * p.head_dim + col] = 0.f;
  }
  for (int row = threadIdx.x; row < seqlen_q; row += kThreads) {
    p.m_state[state_index(row)] = -INFINITY;
    p.l_state[state_index(row)] = 0.f;
  }
  __syncthreads();

  const int a_row = (lane % 8) + ((lane / 8) % 2) * 8, a_col = (lane / 16) * 8;
  const int b_row = (lane % 8) + (lane / 16) * 8, b_col = ((lane / 8) % 2) * 8;
  const int key_first = mask.first_key(0), key_last = mask.last_key(seqlen_q - 1);
  const int n_begin = key_first / kBlockN, n_end = key_last > key_first ? (key_last + kBlockN - 1) / kBlockN : n_begin;

  // Line 5: the outer loop over K/V blocks.
  for (int n_block = n_begin; n_block < n_end; ++n_block) {
    const int key0 = n_block * kBlockN;
    __syncthreads();  // every warp is done with the previous K_j, V_j
    // Line 6: K_j, V_j into SRAM.
    load_rows<kHeadDim, kStride>(k_shared, k + key0 * p.k.row_stride, p.k.row_stride, kBlockN, seqlen_k - key0,
                                 p.head_dim, p.vector_loads, threadIdx.x, kThreads);
    load_rows<kHeadDim, kStride>(v_shared, v + key0 * p.v.row_stride, p.v.row_stride, kBlockN, seqlen_k - key0,
                                 p.head_dim, p.vector_loads, threadIdx.x, kThreads);
    __syncthreads();

    // Line 7: the inner loop over Q blocks.
    for (int m_block = 0; m_block < m_blocks; ++m_block) {
      const int row_begin = m_block * kBlockM, row_last = min(row_begin + kBlockM, seqlen_q) - 1;
      const int first = mask.first_key(row_begin), last = mask.last_key(row_last);
      if (last <= first || key0 >= last || key0 + kBlockN <= first) continue;  // an empty block: skipped
      const bool last_block_of_row_block = n_block == (last - 1) / kBlockN;
      const int warp_row0 = warp * kWarpRows;

      // Line 8: Q_i (this warp's rows) into SRAM; O_i, l_i, m_i are read below, per thread.
      __syncwarp();
      load_rows<kHeadDim, kStride>(q_shared + warp_row0 * kStride, q + (row_begin + warp_row0) * p.q.row_stride,
                                   p.q.row_stride, kWarpRows, seqlen_q - row_begin - warp_row0, p.head_dim,
                                   p.vector_loads, lane, kWarpSize);
      __syncwarp();

      // Line 9: S_ij = scale * Q_i K_j^T.
      float acc_s[kNTiles][4];
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) acc_s[nt][0] = acc_s[nt][1] = acc_s[nt][2] = acc_s[nt][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        std::uint32_t a[4];
        ldmatrix_x4(a, shared_address(q_shared + (warp_row0 + a_row) * kStride + ks * 16 + a_col));
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {
          std::uint32_t b[4];
          ldmatrix_x4(b, shared_address(k_shared + (np * 16 + b_row) * kStride + ks * 16 + b_col));
          mma_16816<__half>(acc_s[2 * np], a, b[0], b[1]);
          mma_16816<__half>(acc_s[2 * np + 1], a, b[2], b[3]);
        }
      }
      if (!mask.block_full(row_begin, row_last, key0, key0 + kBlockN)) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (!mask.visible(row_begin + warp_row0 + g + (e / 2) * 8, key0 + nt * 8 + 2 * t + (e % 2))) acc_s[nt][e] = -INFINITY;
          }
      }

      // Lines 10-11: m~ = rowmax(S), P~ = exp(S - m~), l~ = rowsum(P~); m_new, l_new.
      float old_factor[2], new_factor[2], l_new[2], m_new[2];
      bool row_valid[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row_begin + warp_row0 + g + 8 * r;
        row_valid[r] = row < seqlen_q;
        float block_max = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) block_max = fmaxf(block_max, fmaxf(acc_s[nt][2 * r], acc_s[nt][2 * r + 1]));
        block_max = quad_reduce(block_max, MaxOp{}) * p.scale_log2;
        const float subtract = block_max == -INFINITY ? 0.f : block_max;
        float block_sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          acc_s[nt][2 * r] = exp2f(fmaf(acc_s[nt][2 * r], p.scale_log2, -subtract));
          acc_s[nt][2 * r + 1] = exp2f(fmaf(acc_s[nt][2 * r + 1], p.scale_log2, -subtract));
          block_sum += acc_s[nt][2 * r] + acc_s[nt][2 * r + 1];
        }
        block_sum = quad_reduce(block_sum, SumOp{});
        const float m_old = row_valid[r] ? p.m_state[state_index(row)] : -INFINITY;
        const float l_old = row_valid[r] ? p.l_state[state_index(row)] : 0.f;
        m_new[r] = fmaxf(m_old, block_max);
        const float reference = m_new[r] == -INFINITY ? 0.f : m_new[r];
        old_factor[r] = l_old * exp2f(m_old - reference);
        new_factor[r] = exp2f(block_max - reference);
        l_new[r] = old_factor[r] + new_factor[r] * block_sum;
      }

      // P~_ij V_j on the tensor cores.
      float acc_pv[kDTiles][4];
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) acc_pv[dt][0] = acc_pv[dt][1] = acc_pv[dt][2] = acc_pv[dt][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const std::uint32_t a[4] = {pack2<__half>(acc_s[2 * kk][0], acc_s[2 * kk][1]),
                                    pack2<__half>(acc_s[2 * kk][2], acc_s[2 * kk][3]),
                                    pack2<__half>(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]),
                                    pack2<__half>(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < kDTiles / 2; ++dp) {
          std::uint32_t b[4];
          ldmatrix_x4_trans(b, shared_address(v_shared + (kk * 16 + a_row) * kStride + dp * 16 + a_col));
          mma_16816<__half>(acc_pv[2 * dp], a, b[0], b[1]);
          mma_16816<__half>(acc_pv[2 * dp + 1], a, b[2], b[3]);
        }
      }
      __syncwarp();  // every lane of a quad has read m and l before lane t == 0 rewrites them

      // Lines 12-13: O_i = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~ - m_new) P~ V_j),
      // l_i = l_new, m_i = m_new, all written back to HBM (or, after the last block, O and LSE).
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (!row_valid[r]) continue;
        const int row = row_begin + warp_row0 + g + 8 * r;
        const float inverse = l_new[r] > 0.f ? 1.f / l_new[r] : 0.f;
        float* o_state = p.o_state + state_index(row) * p.head_dim;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = dt * 8 + 2 * t + e;
            if (col >= p.head_dim) continue;
            const float value = (old_factor[r] * o_state[col] + new_factor[r] * acc_pv[dt][2 * r + e]) * inverse;
            if (last_block_of_row_block) {
              o[row * p.o.row_stride + col] = __float2half_rn(value);
            } else {
              o_state[col] = value;
            }
          }
        }
        if (t == 0) {
          if (last_block_of_row_block) {
            lse[row * p.lse.row_stride] = l_new[r] > 0.f ? (m_new[r] + __log2f(l_new[r])) * kLn2Float : -INFINITY;
          } else {
            p.m_state[state_index(row)] = m_new[r];
            p.l_state[state_index(row)] = l_new[r];
          }
        }
      }
    }
  }

  // Query blocks that see no key at all: O = 0 and LSE = -inf (no K/V block visited them).
  for (int m_block = 0; m_block < m_blocks; ++m_block) {
    const int row_begin = m_block * kBlockM, row_last = min(row_begin + kBlockM, seqlen_q) - 1;
    if (mask.last_key(row_last) > mask.first_key(row_begin)) continue;
    for (int index = threadIdx.x; index < (row_last - row_begin + 1) * p.head_dim; index += kThreads) {
      const int row = row_begin + index / p.head_dim, col = index % p.head_dim;
      o[row * p.o.row_stride + col] = __float2half_rn(0.f);
      if (col == 0) lse[row * p.lse.row_stride] = -INFINITY;
    }
  }
}

}  // namespace flashlab::kernels::fa1
