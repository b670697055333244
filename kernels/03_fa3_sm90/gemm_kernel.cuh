// A warp-specialized GEMM from the rung's primitives, the check that they reach the tensor cores'
// speed before attention is built on them: C = A B^T with A [M, K] and B [N, K] row-major bf16
// (both K-major), fp32 accumulation, C [M, N] row-major bf16.
//
// One producer warpgroup's first thread streams 128 x 64 tiles of A and 256 x 64 tiles of B into a
// kStages ring with TMA (full and empty mbarriers per stage); two consumer warpgroups each own 64
// rows of the 128 x 256 C tile and issue four m64n256k16 wgmma per stage, keeping one stage's
// group in flight while the next is issued; the producer gives its registers to them (setmaxnreg).
// The epilogue writes C from registers. Edges need no special case: TMA reads zeros outside A and
// B, and the stores are bounded.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/sm90_sync.cuh"
#include "kernels/common/sm90_tma.cuh"
#include "kernels/common/sm90_wgmma.cuh"

namespace flashlab::kernels {

struct GemmTile {
  static constexpr int kBlockM = 128, kBlockN = 256, kBlockK = 64, kStages = 4;
  static constexpr int kConsumerWarpgroups = kBlockM / 64, kThreads = 128 * (kConsumerWarpgroups + 1);
  static constexpr int kABytes = kBlockM * kBlockK * 2, kBBytes = kBlockN * kBlockK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kSharedBytes = kStages * kStageBytes + 2048;  // + barriers and 1024-byte alignment
  static constexpr int kGroupM = 8;  // tiles walk 8 row blocks per column block, so B tiles stay in L2
};

struct GemmParams {
  CUtensorMap a_map, b_map;  // boxes of 64 columns (K) x kBlockM or kBlockN rows
  __nv_bfloat16* c;
  int m, n, k;
  std::int64_t c_row_stride;
};

template <class Tile>
__global__ void __launch_bounds__(Tile::kThreads, 1) gemm_bf16_kernel(const __grid_constant__ GemmParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* shared = aligned_shared_base<1024>(shared_raw);
  Mbarrier* full = reinterpret_cast<Mbarrier*>(shared + Tile::kStages * Tile::kStageBytes);
  Mbarrier* empty = full + Tile::kStages;

  // Tile order: groups of kGroupM row blocks sweep the column blocks.
  const int m_blocks = (p.m + Tile::kBlockM - 1) / Tile::kBlockM, n_blocks = (p.n + Tile::kBlockN - 1) / Tile::kBlockN;
  const int group = blockIdx.x / (Tile::kGroupM * n_blocks), first_m = group * Tile::kGroupM;
  const int group_rows = min(Tile::kGroupM, m_blocks - first_m);
  const int m_block = first_m + static_cast<int>(blockIdx.x) % (Tile::kGroupM * n_blocks) % group_rows;
  const int n_block = static_cast<int>(blockIdx.x) % (Tile::kGroupM * n_blocks) / group_rows;
  const int k_tiles = (p.k + Tile::kBlockK - 1) / Tile::kBlockK;

  if (threadIdx.x == 0) {
    for (int stage = 0; stage < Tile::kStages; ++stage) {
      mbarrier_init(&full[stage], 1);
      mbarrier_init(&empty[stage], 4 * Tile::kConsumerWarpgroups);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    registers_decrease_to<40>();
    if (threadIdx.x == 0) {
      RingPosition<Tile::kStages> ring;
      for (int k_tile = 0; k_tile < k_tiles; ++k_tile, ring.advance()) {
        unsigned char* stage = shared + ring.stage * Tile::kStageBytes;
        mbarrier_wait(&empty[ring.stage], ring.phase ^ 1);
        mbarrier_arrive_expect_bytes(&full[ring.stage], Tile::kStageBytes);
        tma_load(stage, p.a_map, k_tile * Tile::kBlockK, m_block * Tile::kBlockM, 0, 0, &full[ring.stage]);
        tma_load(stage + Tile::kABytes, p.b_map, k_tile * Tile::kBlockK, n_block * Tile::kBlockN, 0, 0, &full[ring.stage]);
      }
    }
    return;
  }
  registers_increase_to<232>();
  const int consumer = warpgroup - 1, thread = threadIdx.x % 128, lane = thread % 32;
  const std::uint32_t shared_base = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared));
  float c[Tile::kBlockN / 2];
  RingPosition<Tile::kStages> ring, previous;
  for (int k_tile = 0; k_tile < k_tiles; ++k_tile) {
    const std::uint32_t stage = shared_base + ring.stage * Tile::kStageBytes;
    const std::uint64_t a = k_major_descriptor(stage + consumer * 64 * 128);
    const std::uint64_t b = k_major_descriptor(stage + Tile::kABytes);
    mbarrier_wait(&full[ring.stage], ring.phase);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < Tile::kBlockK / 16; ++k) {
      Wgmma<__nv_bfloat16, Tile::kBlockN>::template ss<0>(c, a + k * 2, b + k * 2, k_tile > 0 || k > 0);
    }
    wgmma_commit();
    if (k_tile > 0) {
      wgmma_wait<1>();  // the previous stage's products are done: its buffers may be refilled
      if (lane == 0) mbarrier_arrive(&empty[previous.stage]);
    }
    previous = ring;
    ring.advance();
  }
  wgmma_wait<0>();
  fence_registers(c);

  // C from the accumulators (layout in sm90_wgmma.cuh): rows g and g + 8 of each warp's 16.
  const int warp = thread / 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = m_block * Tile::kBlockM + consumer * 64 + warp * 16 + g + 8 * r;
    if (row >= p.m) continue;
    __nv_bfloat16* c_row = p.c + row * p.c_row_stride;
#pragma unroll
    for (int i = 0; i < Tile::kBlockN / 8; ++i) {
      const int column = n_block * Tile::kBlockN + 8 * i + 2 * t;
      if (column + 1 < p.n) {
        *reinterpret_cast<__nv_bfloat162*>(c_row + column) = __floats2bfloat162_rn(c[4 * i + 2 * r], c[4 * i + 2 * r + 1]);
      } else if (column < p.n) {
        c_row[column] = __float2bfloat16_rn(c[4 * i + 2 * r]);
      }
    }
  }
#else
  (void)p;
  __trap();
#endif
}

}  // namespace flashlab::kernels
