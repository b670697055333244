// The FA3-generation backward kernels (FlashAttention-3, Shah et al. 2024, Section 3 applied to
// FA2 Algorithm 2), for sm_90a; kernels/03_fa3_sm90/backward_host.cu fills their parameters,
// backward_instances/ instantiates them, one head dim per file; backward_tiling.hpp gives the tiles.
//
// Three kernels on one stream, as in the FA2 rung: the FA2 rung's preprocess (D = rowsum(dO * O)
// and LSE in base 2, Algorithm 2 line 4), the main kernel here, and the dQ convert here.
//
// The main kernel: one block per (key block j, KV head, batch); warp specialization (Section 3.1):
// a producer warpgroup (warp 0 brings the inputs by TMA, backward_pipeline.cuh; warps 1 and 2 the
// dQ of the dataflow) and two consumer warpgroups on wgmma, in one of two dataflows: keys split
// (d 64, 128; backward_keys_split.cuh) or head dim split (d 256; backward_head_dim_split.cuh).
// setmaxnreg moves registers from the producer warpgroup to the consumers.
#pragma once

#include "kernels/03_fa3_sm90/backward_head_dim_split.cuh"
#include "kernels/03_fa3_sm90/backward_keys_split.cuh"

namespace flashlab::kernels::fa3 {

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(BackwardTiling<kHeadDim>::kThreads, BackwardTiling<kHeadDim>::kMinBlocksPerSm)
    fa3_backward_kernel(const __grid_constant__ BackwardParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = BackwardTiling<kHeadDim>;
  static_assert(Tile::kStages <= BackwardBarriers::kMaxStages);
  static_assert(sizeof(BackwardBarriers) <= 256, "the barriers fit their space");
  extern __shared__ unsigned char shared_raw[];
  unsigned char* shared = aligned_shared_base<1024>(shared_raw);
  BackwardBarriers& bars = *reinterpret_cast<BackwardBarriers*>(shared + Tile::kBarriers);
  const KeyBlockWork w = key_block_work<Tile>(p);
  if (w.key_begin >= w.sequence.seqlen_k) return;  // varlen: past this sequence's end (the whole block)
  if (threadIdx.x == 0) {
    mbarrier_init(&bars.kv_full, 1);
    for (int stage = 0; stage < Tile::kStages; ++stage) {
      mbarrier_init(&bars.q_full[stage], 1);    // producer warp 0's lane 0, with the bytes
      mbarrier_init(&bars.q_empty[stage], 8);   // each consumer warp
    }
    for (int slice = 0; slice < 2; ++slice) {
      mbarrier_init(&bars.dq_full[slice], 4);   // each warp of the slice's warpgroup
      mbarrier_init(&bars.dq_empty[slice], 1);  // the step's dQ writer
    }
    mbarrier_init(&bars.dq_turn, 1);   // order_dq_additions
    mbarrier_init(&bars.dq_added, 8);  // each consumer warp
    mbarrier_init_fence();
  }
  __syncthreads();
  // The warpgroup index through a shuffle, so the compiler knows it is the same in every lane (the
  // consumers' matrix descriptors then stay in uniform registers).
  const int warpgroup = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x) / 128, 0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warpgroup == 0) {
    registers_decrease_to<Tile::kProducerRegisters>();
    if (warp == 0 && lane == 0) produce_inputs<Tile>(p, w, shared, bars);
    if constexpr (Tile::kHeadDimSplit) {
      if (warp == 1 && lane == 0 && p.deterministic) order_dq_additions<Tile>(p, w, bars);
    } else {
      if (warp == 1 || warp == 2) write_dq<Tile>(p, w, shared, bars, warp - 1, lane);
    }
  } else {
    registers_increase_to<Tile::kConsumerRegisters>();
    if constexpr (Tile::kHeadDimSplit) {
      consume_head_dim_split<T, Tile>(p, w, shared, bars, warpgroup - 1);
    } else {
      consume<T, Tile>(p, w, shared, bars, warpgroup - 1);
    }
  }
#else
  (void)p;
  __trap();
#endif
}

// dQ = scale * accumulator, rounded to the dtype, back from the slices to rows. One block per
// (query block, head, batch); each thread turns one (tile, thread) group of 4 values into two pairs.
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(256) fa3_backward_convert_dq_kernel(const BackwardParams p) {
  using Tile = BackwardTiling<kHeadDim>;
  const int query_block = blockIdx.x, head = blockIdx.y, b = blockIdx.z;
  const SequenceView seq = sequence_view(p, b);
  const int query_begin = query_block * Tile::kBlockM;
  if (query_begin >= seq.seqlen_q) return;
  const float* tile = p.dq_accum + (static_cast<std::int64_t>(head) * p.dq_rows + fa2::dq_first_row(seq, b) + query_begin) * kHeadDim;
  T* dq = p.dq.as<T>() + p.dq.offset(seq.batch, seq.position_q, query_begin, head);
  for (int index = threadIdx.x; index < Tile::kDqSlices * Tile::kDqSliceFloats / 4; index += blockDim.x) {
    // index = slice * 1024 + n8 tile * 128 + thread (dq_slice_index / 4).
    const int slice = index / 1024, tile_index = index / 128 % 8, thread = index % 128;
    const int lane = thread % 32;
    int row = 16 * (thread / 32) + lane / 4, column = 8 * tile_index + 2 * (lane % 4);
    if (Tile::kDqSplitsColumns) {
      column += 64 * slice;
    } else {
      row += 64 * slice;
    }
    if (column >= p.head_dim) continue;
    const float4 value = *reinterpret_cast<const float4*>(tile + 4 * index);
    if (query_begin + row < seq.seqlen_q) {
      *reinterpret_cast<std::uint32_t*>(dq + row * p.dq.row_stride + column) = pack2<T>(value.x * p.scale, value.y * p.scale);
    }
    if (query_begin + row + 8 < seq.seqlen_q) {
      *reinterpret_cast<std::uint32_t*>(dq + (row + 8) * p.dq.row_stride + column) =
          pack2<T>(value.z * p.scale, value.w * p.scale);
    }
  }
}

// Launches the three kernels for one instance (backward_instances/).
template <typename T, int kHeadDim>
void launch_fa3_backward(const BackwardParams& params, cudaStream_t stream);

}  // namespace flashlab::kernels::fa3
