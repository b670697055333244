// The FA2 rung's forward kernel (FlashAttention-2, Dao 2023, Algorithm 1), templated on the
// element type, the padded head dimension and the shared-memory budget its tiling must fit
// (ForwardTiling, forward_tiling.hpp); forward_host.cu dispatches to it and the files in
// forward_instances/ instantiate it, one head dimension per file so the build compiles them in
// parallel.
//
// One thread block per (query block, head, batch): grid (ceil(seqlen_q / kBlockM), heads_q, batch).
// Each warp owns 16 * kMTiles query rows and keeps their output rows, running max m and running
// sum l in registers for the whole key loop (FA2 Section 3.1: the warps split Q, not K, so no
// warp talks to another). K and V blocks stream through a kStages-deep shared-memory ring filled
// with cp.async; fragments come out of shared memory with ldmatrix (V transposed on the fly) and
// go into mma.sync m16n8k16 with fp32 accumulators. The softmax works in base 2 with the scale
// folded into one FFMA per score (exp2(s * scale * log2 e - m)); O is divided by l once, after
// the last key block (Algorithm 1 line 12), and LSE = m + log l written (line 13). Key blocks that
// the causal or window mask hides entirely are never visited; only blocks that cross the mask's
// edge (or the end of the keys) are masked element by element.
#pragma once

#include <cstdint>

#include "kernels/02_fa2_sm80/forward_tiling.hpp"
#include "kernels/common/attention_params.hpp"
#include "kernels/common/constants.hpp"
#include "kernels/common/conversions.cuh"
#include "kernels/common/reductions.cuh"
#include "kernels/common/sm80.cuh"

namespace flashlab::kernels::fa2 {

struct ForwardParams : AttentionParams {
  int reverse_blocks;  // visit query blocks last-first (causal: heaviest first)
};

template <typename T, int kHeadDim, int kSharedBudget>
__global__ void __launch_bounds__(ForwardTiling<kHeadDim, kSharedBudget>::kWarps * kWarpSize,
                                  ForwardTiling<kHeadDim, kSharedBudget>::kMinBlocksPerSm)
    fa2_forward_kernel(const ForwardParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace device;
  using Tile = ForwardTiling<kHeadDim, kSharedBudget>;
  constexpr int kWarps = Tile::kWarps, kMTiles = Tile::kMTiles, kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN;
  constexpr int kStages = Tile::kStages, kStride = Tile::kRowStride, kThreads = kWarps * kWarpSize;
  constexpr int kKSteps = kHeadDim / 16;   // k-steps of S = Q K^T
  constexpr int kNTiles = kBlockN / 8;     // n8 tiles of S
  constexpr int kDTiles = kHeadDim / 8;    // n8 tiles of O

  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* q_shared = reinterpret_cast<T*>(shared_bytes);
  T* k_shared = q_shared + kBlockM * kStride;
  T* v_shared = k_shared + kStages * kBlockN * kStride;
  static_assert(sizeof(T) == kElementBytes);
  static_assert((kBlockM + 2 * kStages * kBlockN) * kStride * sizeof(T) == Tile::kSharedBytes,
                "the Q tile and the K/V ring fill the tiling's shared memory");

  const int m_block = p.reverse_blocks ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / p.group_size;

  // This sequence's rows (Algorithm 1 works on one (sequence, head); varlen packs sequences).
  const SequenceView seq = sequence_view(p, batch);
  const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k;
  const int row_begin = m_block * kBlockM;
  if (row_begin >= seqlen_q) return;
  const int row_last = min(row_begin + kBlockM, seqlen_q) - 1;

  const T* q = p.q.as<const T>() + seq.q_start + head * p.q.head_stride + row_begin * p.q.row_stride;
  const T* k = p.k.as<const T>() + seq.k_start + kv_head * p.k.head_stride;
  const T* v = p.v.as<const T>() + seq.v_start + kv_head * p.v.head_stride;
  T* o = p.o.as<T>() + seq.o_start + head * p.o.head_stride + row_begin * p.o.row_stride;
  float* lse = p.lse.as<float>() + seq.lse_start + head * p.lse.head_stride + row_begin * p.lse.row_stride;

  const MaskRule mask = mask_rule(p, seq);
  // The key blocks this query block can see at all: the others are skipped, not masked.
  const int key_first = mask.first_key(row_begin), key_last = mask.last_key(row_last);
  const int n_begin = key_first / kBlockN;
  const int n_end = key_last > key_first ? (key_last + kBlockN - 1) / kBlockN : n_begin;

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int warp_row0 = warp * 16 * kMTiles;

  float acc_o[kMTiles][kDTiles][4];
  float row_max[kMTiles][2], row_sum[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) acc_o[mt][dt][0] = acc_o[mt][dt][1] = acc_o[mt][dt][2] = acc_o[mt][dt][3] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }

  if (n_end > n_begin) {
    // Q block (line 4), then the first kStages - 1 K/V blocks into the ring.
    load_tile_async<T, kHeadDim, kBlockM, kThreads, kStride>(q_shared, q, p.q.row_stride, seqlen_q - row_begin, p.head_dim);
    cp_async_commit();
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      const int n_block = n_begin + s;
      if (n_block < n_end) {
        const int key0 = n_block * kBlockN;
        load_tile_async<T, kHeadDim, kBlockN, kThreads, kStride>(k_shared + s * kBlockN * kStride, k + key0 * p.k.row_stride,
                                                                p.k.row_stride, seqlen_k - key0, p.head_dim);
        load_tile_async<T, kHeadDim, kBlockN, kThreads, kStride>(v_shared + s * kBlockN * kStride, v + key0 * p.v.row_stride,
                                                                p.v.row_stride, seqlen_k - key0, p.head_dim);
      }
      cp_async_commit();
    }
  }

  constexpr int kQSteps = Tile::kQInRegisters ? kKSteps : 1;
  std::uint32_t q_fragments[kMTiles][kQSteps][4];
  // Lane offsets of the ldmatrix row addresses (common/sm80.cuh gives the fragment layouts).
  const int a_row = (lane % 8) + ((lane / 8) % 2) * 8, a_col = (lane / 16) * 8;  // Q, and V transposed
  const int b_row = (lane % 8) + (lane / 16) * 8, b_col = ((lane / 8) % 2) * 8;  // K
  // This lane's ldmatrix row addresses in stage 0 at k-step 0; the loop adds compile-time offsets
  // and the stage's.
  constexpr int kRowBytes = kStride * kElementBytes, kStageBytes = kBlockN * kRowBytes;
  const std::uint32_t q_lane = shared_address(q_shared) + ((warp_row0 + a_row) * kStride + a_col) * kElementBytes;
  const std::uint32_t k_lane = shared_address(k_shared) + (b_row * kStride + b_col) * kElementBytes;
  const std::uint32_t v_lane = shared_address(v_shared) + (a_row * kStride + a_col) * kElementBytes;

  // Algorithm 1 lines 6-11: the key blocks, in order.
  for (int n_block = n_begin; n_block < n_end; ++n_block) {
    const int iteration = n_block - n_begin;
    const int stage = iteration % kStages;
    cp_async_wait<kStages - 2>();  // this block's K and V (and Q) have landed ...
    __syncthreads();               // ... for every thread, and the stage refilled below is free
    {
      const int next = n_block + kStages - 1;
      if (next < n_end) {
        const int next_stage = (iteration + kStages - 1) % kStages;
        const int key0 = next * kBlockN;
        load_tile_async<T, kHeadDim, kBlockN, kThreads, kStride>(k_shared + next_stage * kBlockN * kStride,
                                                                k + key0 * p.k.row_stride, p.k.row_stride,
                                                                seqlen_k - key0, p.head_dim);
        load_tile_async<T, kHeadDim, kBlockN, kThreads, kStride>(v_shared + next_stage * kBlockN * kStride,
                                                                v + key0 * p.v.row_stride, p.v.row_stride,
                                                                seqlen_k - key0, p.head_dim);
      }
      cp_async_commit();
    }
    if constexpr (Tile::kQInRegisters) {
      if (iteration == 0) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int ks = 0; ks < kKSteps; ++ks)
            ldmatrix_x4(q_fragments[mt][ks], q_lane + mt * 16 * kRowBytes + ks * 32);
      }
    }

    // Line 8: S = Q K_j^T for this warp's rows (fp32 accumulators).
    const std::uint32_t k_tile = k_lane + stage * kStageBytes;
    float acc_s[kMTiles][kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) acc_s[mt][nt][0] = acc_s[mt][nt][1] = acc_s[mt][nt][2] = acc_s[mt][nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      std::uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        if constexpr (Tile::kQInRegisters) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a[mt][i] = q_fragments[mt][ks][i];
        } else {
          ldmatrix_x4(a[mt], q_lane + mt * 16 * kRowBytes + ks * 32);
        }
      }
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        std::uint32_t b[4];
        ldmatrix_x4(b, k_tile + np * 16 * kRowBytes + ks * 32);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816<T>(acc_s[mt][2 * np], a[mt], b[0], b[1]);
          mma_16816<T>(acc_s[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }

    // Only blocks that cross the mask's edge or the end of the keys are masked element-wise.
    const int key0 = n_block * kBlockN;
    if (!mask.block_full(row_begin, row_last, key0, key0 + kBlockN)) {
      // Each row's visible keys are one interval [low, high]: two compares per score.
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const KeyInterval keys = mask.row_keys(row_begin + warp_row0 + mt * 16 + g + 8 * r);
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int col = key0 + nt * 8 + 2 * t + e;
              if (col > keys.high || col < keys.low) acc_s[mt][nt][2 * r + e] = -INFINITY;
            }
        }
    }

    // Lines 9-10: the online softmax in base 2, scale folded into one FFMA; the running sum
    // stays per thread until the end (the quad reduces it once). Every row's max and sum is a
    // balanced tree over its scores and all rows go through each phase together, so no long
    // chain of dependent instructions stalls the two warps a scheduler has.
    float block_max[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float partial[kNTiles];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) partial[nt] = fmaxf(acc_s[mt][nt][2 * r], acc_s[mt][nt][2 * r + 1]);
        block_max[mt][r] = tree_reduce(partial, MaxOp{});
      }
#pragma unroll
    for (int lanes = 1; lanes <= 2; lanes *= 2)
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) block_max[mt][r] = fmaxf(block_max[mt][r], __shfl_xor_sync(kAllLanes, block_max[mt][r], lanes));
    float corrections[kMTiles][2];
    bool any_correction = false;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // The running max moves only when the block's exceeds it by more than
        // kRescaleThresholdLog2 (FA4's conditional rescaling): P = exp2(s - m) then stays
        // <= 2^kRescaleThresholdLog2, and O and l carry
        // the same stale m, which the final O / l cancels exactly.
        const float block_row_max = block_max[mt][r] * p.scale_log2;
        const bool max_moves = block_row_max > row_max[mt][r] + kRescaleThresholdLog2;
        const float new_max = max_moves ? block_row_max : row_max[mt][r];
        const float subtract = new_max == -INFINITY ? 0.f : new_max;  // a row that has seen no key yet
        const float correction = exp2f(row_max[mt][r] - subtract);
        row_max[mt][r] = new_max;
        float partial[kNTiles];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          acc_s[mt][nt][2 * r] = exp2f(fmaf(acc_s[mt][nt][2 * r], p.scale_log2, -subtract));
          acc_s[mt][nt][2 * r + 1] = exp2f(fmaf(acc_s[mt][nt][2 * r + 1], p.scale_log2, -subtract));
          partial[nt] = acc_s[mt][nt][2 * r] + acc_s[mt][nt][2 * r + 1];
        }
        row_sum[mt][r] = row_sum[mt][r] * correction + tree_reduce(partial, SumOp{});
        corrections[mt][r] = correction;
        any_correction = any_correction || correction != 1.f;
      }
    // The rescale of O (line 10's diag(e^(m_old - m_new))) is skipped when no row of the warp
    // moved its maximum: with the growth threshold above that is almost every block after the
    // first, and it saves a multiply per output element per block.
    if (__any_sync(kAllLanes, any_correction)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          acc_o[mt][dt][0] *= corrections[mt][0];
          acc_o[mt][dt][1] *= corrections[mt][0];
          acc_o[mt][dt][2] *= corrections[mt][1];
          acc_o[mt][dt][3] *= corrections[mt][1];
        }
    }

    // Line 10: O += P V_j, P straight from the accumulators (the C layout of two n8 tiles is the
    // A layout of one k16 step), packed to 16 bits at once so the fp32 scores die here; V is
    // transposed by ldmatrix.
    std::uint32_t p_packed[kMTiles][kBlockN / 16][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        p_packed[mt][kk][0] = pack2<T>(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
        p_packed[mt][kk][1] = pack2<T>(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
        p_packed[mt][kk][2] = pack2<T>(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
        p_packed[mt][kk][3] = pack2<T>(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
      }
    const std::uint32_t v_tile = v_lane + stage * kStageBytes;
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        std::uint32_t b[4];
        ldmatrix_x4_trans(b, v_tile + kk * 16 * kRowBytes + dp * 32);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_16816<T>(acc_o[mt][2 * dp], p_packed[mt][kk], b[0], b[1]);
          mma_16816<T>(acc_o[mt][2 * dp + 1], p_packed[mt][kk], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // Lines 12-13: one normalisation, O and LSE written (a row that saw no key: O = 0, LSE = -inf).
  // O goes through this warp's own rows of the Q tile in shared memory (no other warp reads
  // them), so the stores to HBM are 16 bytes wide and coalesced.
  T* o_tile = q_shared;
  __syncwarp();  // this warp's last ldmatrix reads of its Q rows come before the writes below
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = quad_reduce(row_sum[mt][r], SumOp{});
      const float inverse = sum > 0.f ? 1.f / sum : 0.f;
      const int row = warp_row0 + mt * 16 + g + 8 * r;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        *reinterpret_cast<std::uint32_t*>(o_tile + row * kStride + dt * 8 + 2 * t) =
            pack2<T>(acc_o[mt][dt][2 * r] * inverse, acc_o[mt][dt][2 * r + 1] * inverse);
      }
      if (t == 0 && row_begin + row < seqlen_q) {
        lse[row * p.lse.row_stride] = sum > 0.f ? (row_max[mt][r] + __log2f(sum)) * kLn2Float : -INFINITY;
      }
    }
  __syncwarp();
  constexpr int kChunksPerRow = kHeadDim / kChunkElements, kWarpRows = 16 * kMTiles;
#pragma unroll
  for (int i = lane; i < kWarpRows * kChunksPerRow; i += kWarpSize) {
    const int row = warp_row0 + i / kChunksPerRow, col = (i % kChunksPerRow) * kChunkElements;
    if (row_begin + row < seqlen_q && col < p.head_dim) {
      *reinterpret_cast<uint4*>(o + row * p.o.row_stride + col) = *reinterpret_cast<const uint4*>(o_tile + row * kStride + col);
    }
  }
#else
  (void)p;
  __trap();
#endif
}

// Launches the kernel for one (element type, padded head dim) with the widest tiling the device's
// shared memory allows; defined in forward_launch.cuh, instantiated in forward_instances/.
template <typename T, int kHeadDim>
void launch_fa2_forward(const ForwardParams& params, int batch, int shared_bytes_limit, cudaStream_t stream);

}  // namespace flashlab::kernels::fa2
