// The FA3-generation backward kernels (FlashAttention-3, Shah et al. 2024, Section 3 applied to
// FA2 Algorithm 2), for sm_90a; kernels/03_fa3_sm90/backward_host.cu fills their parameters,
// backward_instances/ instantiates them, one head dim per file; backward_tiling.hpp gives the tiles.
//
// Three kernels on one stream, as in the FA2 rung: the FA2 rung's preprocess (D = rowsum(dO * O)
// and LSE in base 2, Algorithm 2 line 4), the main kernel here, and the dQ convert here; the last
// two launched as programmatic dependents of the kernel before them (backward_launch.cuh), so
// that each starts while that kernel's last blocks finish and waits for it where it reads its output.
//
// The main kernel: one block per (key block j, KV head, batch), or at d 64 persistent, each block
// walking key blocks (backward_pipeline.cuh's walk; BackwardTiling::kPersistent); warp
// specialization (Section 3.1):
// a producer warpgroup (warp 0 brings the inputs by TMA, backward_pipeline.cuh; warps 1 and 2 the
// dQ of the dataflow) and two consumer warpgroups on wgmma, in one of two dataflows: keys split
// (d 64, 128; backward_keys_split.cuh) or head dim split (d 256; backward_head_dim_split.cuh).
// setmaxnreg moves registers from the producer warpgroup to the consumers.
#pragma once

#include "kernels/03_fa3_sm90/backward_head_dim_split.cuh"
#include "kernels/03_fa3_sm90/backward_keys_split.cuh"

namespace flashlab::kernels::fa3 {

template <typename T, int kHeadDim, bool kMaskedVariant>
__global__ void __launch_bounds__(BackwardTiling<kHeadDim, kMaskedVariant>::kThreads,
                                  BackwardTiling<kHeadDim, kMaskedVariant>::kMinBlocksPerSm)
    fa3_backward_kernel(const __grid_constant__ BackwardParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = BackwardTiling<kHeadDim, kMaskedVariant>;
  static_assert(Tile::kStages <= BackwardBarriers::kMaxStages);
  static_assert(sizeof(BackwardBarriers) <= Tile::kBarrierBytes, "the barriers fit their space");
  static_assert(kWalkSlots * sizeof(KeyBlockWork) + Tile::kWarps * sizeof(int) <= Tile::kWalkBytes, "the walk fits its space");
  extern __shared__ unsigned char shared_raw[];
  unsigned char* shared = aligned_shared_base<1024>(shared_raw);
  BackwardBarriers& bars = *reinterpret_cast<BackwardBarriers*>(shared + Tile::kBarriers);
  KeyBlockWork* walk = reinterpret_cast<KeyBlockWork*>(shared + Tile::kWalk);
  // The walk's readers: producer warp 0's lane 0, the dQ writers (head dim split: one lane; else
  // whole warps) and the eight consumer warps; each reading lane releases a slot.
  const int dq_writer_warps = Tile::kHeadDimSplit ? (p.deterministic ? 1 : 0) : (p.deterministic ? 2 : 1);
  const int walk_readers = 1 + (Tile::kHeadDimSplit ? dq_writer_warps : 32 * dq_writer_warps) + 8 * 32;
  if (threadIdx.x == 0) {
    device::allow_dependent_launch();  // the dQ convert, launched as this kernel's dependent, may be scheduled
    // The tensor maps first, so that their fetch overlaps the set-up before the first loads.
    tma_prefetch_map(p.k_map), tma_prefetch_map(p.v_map), tma_prefetch_map(p.q_map), tma_prefetch_map(p.do_map);
    tma_prefetch_map(p.lse_map), tma_prefetch_map(p.delta_map);
    for (int slot = 0; slot < kWalkSlots; ++slot) {
      mbarrier_init(&bars.walk_full[slot], 1);                         // the walker
      mbarrier_init(&bars.walk_empty[slot], walk_readers);           // each reading lane
    }
    mbarrier_init(&bars.walk_draw, 1);  // producer warp 0's lane 0
    if constexpr (!Tile::kPersistent) write_key_block_work<Tile>(p, static_cast<int>(blockIdx.x), 0, 0, walk[0]);
    mbarrier_init(&bars.k_full, 1);
    mbarrier_init(&bars.v_full, 1);
    mbarrier_init(&bars.kv_empty, 8);  // each consumer warp
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
    // Thread 0 is the producer's lane: a block that walks one key block sends K_j, its first
    // step's loads and V_j now, so that the block's set-up runs behind their latency.
    if constexpr (Tile::kBlockStart) {
      if (!walk[0].past_sequence()) produce_inputs<Tile>(p, walk[0], shared, bars, 0, 1);
    }
  }
  __syncthreads();
  // Launched as the preprocess's dependent: nothing touches its output (LSE, D, the zeroed
  // accumulator) before it ends. Thread 0, the producer's lane, waits before its first LSE_i.
  if (threadIdx.x != 0) device::wait_for_previous_grid();
  // The warpgroup index through a shuffle, so the compiler knows it is the same in every lane (the
  // consumers' matrix descriptors then stay in uniform registers).
  const int warpgroup = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x) / 128, 0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warpgroup == 0) {
    registers_decrease_to<Tile::kProducerRegisters>();
    if (Tile::kPersistent && warp == 3 && lane == 0) walk_ahead<Tile>(p, walk, bars);  // the walker
    if (warp == 0 && lane == 0) {
      for_each_key_block<Tile>(p, walk, bars, 1u,
                               [&](const KeyBlockWork& w) { produce_inputs<Tile>(p, w, shared, bars, Tile::kBlockStart ? 1 : 0); },
                               &bars.walk_draw);
    }
    if constexpr (Tile::kHeadDimSplit) {
      if (warp == 1 && lane == 0 && p.deterministic) {
        for_each_key_block<Tile>(p, walk, bars, 1u, [&](const KeyBlockWork& w) { order_dq_additions<Tile>(p, w, bars); });
      }
    } else if (warp >= 1 && warp <= dq_writer_warps) {
      int steps = 0;  // the block's steps so far
      for_each_key_block<Tile>(p, walk, bars, 0xffffffffu, [&](const KeyBlockWork& w) {
        write_dq<Tile>(p, w, shared, bars, warp - 1, lane);
        steps = w.first_step + w.iterations;
      });
      finish_dq_writes(steps, dq_writer_warps, warp - 1, lane);
    }
  } else {
    registers_increase_to<Tile::kConsumerRegisters>();
    for_each_key_block<Tile, true>(p, walk, bars, 0xffffffffu, [&](const KeyBlockWork& w) {
      if constexpr (Tile::kHeadDimSplit) {
        consume_head_dim_split<T, Tile>(p, w, shared, bars, warpgroup - 1);
      } else {
        consume<T, Tile>(p, w, shared, bars, warpgroup - 1);
      }
    });
  }
#else
  (void)p;
  __trap();
#endif
}

// dQ = scale * accumulator, rounded to the dtype, back from the slices to rows (line 21's dQ
// written out). One block of kConvertThreads per (slice, query block, head, batch): the slice is
// read in its own order (16 coalesced bytes per thread and load) into a row-major shared tile,
// then written out 8 columns (16 bytes) per store, each row's 128 bytes by 8 consecutive threads.
inline constexpr int kConvertThreads = 256;
template <typename T, int kHeadDim, bool kMaskedVariant>
__global__ void __launch_bounds__(kConvertThreads) fa3_backward_convert_dq_kernel(const BackwardParams p) {
  using Tile = BackwardTiling<kHeadDim, kMaskedVariant>;
  constexpr int kSliceRows = Tile::kDqSliceFloats / 64;
  // Floats per shared row: the float2 stores of a half-warp hit 32 banks (transposed: the 4-byte
  // stores of a warp, rows 2 (lane % 4) apart).
  constexpr int kPitch = Tile::kDqTransposed ? 64 + 4 : 64 + 8;
  constexpr int kVectors = Tile::kDqSliceFloats / 4 / kConvertThreads;  // float4 loads per thread
  static_assert(Tile::kDqSliceFloats % (4 * kConvertThreads) == 0, "whole float4 loads per thread");
  __shared__ __align__(16) float rows[kSliceRows * kPitch];
  device::wait_for_previous_grid();  // launched as the main kernel's dependent: its accumulator complete
  const int query_block = blockIdx.x / Tile::kDqSlices, slice = blockIdx.x % Tile::kDqSlices;
  const int head = blockIdx.y, b = blockIdx.z;
  const SequenceView seq = sequence_view(p, b);
  const int query_begin = query_block * Tile::kBlockM;
  if (query_begin >= seq.seqlen_q) return;
  const float* tile = p.dq_accum + (static_cast<std::int64_t>(head) * p.dq_rows + fa2::dq_first_row(seq, b) + query_begin) * kHeadDim +
                      slice * Tile::kDqSliceFloats;
  float4 values[kVectors];
#pragma unroll
  for (int v = 0; v < kVectors; ++v) values[v] = reinterpret_cast<const float4*>(tile)[v * kConvertThreads + threadIdx.x];
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    // dq_slice_index: vector (n8 tile, thread) holds the accumulator's rows a and a + 8, columns c
    // and c + 1: the slice's rows and columns, or (transposed) its columns and rows.
    const int index = v * kConvertThreads + threadIdx.x, n8_tile = index / 128, thread = index % 128, lane = thread % 32;
    const int a = 16 * (thread / 32) + lane / 4, c = 8 * n8_tile + 2 * (lane % 4);
    if constexpr (Tile::kDqTransposed) {
      rows[c * kPitch + a] = values[v].x, rows[(c + 1) * kPitch + a] = values[v].y;
      rows[c * kPitch + a + 8] = values[v].z, rows[(c + 1) * kPitch + a + 8] = values[v].w;
    } else {
      *reinterpret_cast<float2*>(&rows[a * kPitch + c]) = make_float2(values[v].x, values[v].y);
      *reinterpret_cast<float2*>(&rows[(a + 8) * kPitch + c]) = make_float2(values[v].z, values[v].w);
    }
  }
  __syncthreads();
  // The slice's place in the query block: kSliceRows x 64 columns from column 64 * slice, or 64 rows
  // from row 64 * slice.
  const int row0 = Tile::kDqSplitsColumns ? 0 : 64 * slice, column0 = Tile::kDqSplitsColumns ? 64 * slice : 0;
  T* dq = p.dq.as<T>() + p.dq.offset(seq.batch, seq.position_q, query_begin + row0, head) + column0;
#pragma unroll
  for (int chunk = threadIdx.x; chunk < kSliceRows * 8; chunk += kConvertThreads) {
    const int row = chunk / 8, column = 8 * (chunk % 8);
    if (query_begin + row0 + row >= seq.seqlen_q || column0 + column >= p.head_dim) continue;  // head_dim: a multiple of 8
    const float4 low = *reinterpret_cast<const float4*>(&rows[row * kPitch + column]);
    const float4 high = *reinterpret_cast<const float4*>(&rows[row * kPitch + column + 4]);
    const uint4 packed = {pack2<T>(low.x * p.scale, low.y * p.scale), pack2<T>(low.z * p.scale, low.w * p.scale),
                          pack2<T>(high.x * p.scale, high.y * p.scale), pack2<T>(high.z * p.scale, high.w * p.scale)};
    *reinterpret_cast<uint4*>(dq + static_cast<std::int64_t>(row) * p.dq.row_stride + column) = packed;  // 16-byte aligned (fa3_backward)
  }
}

// Launches the three kernels for one instance (backward_instances/).
template <typename T, int kHeadDim, bool kMaskedVariant>
void launch_fa3_backward(const BackwardParams& params, cudaStream_t stream);

}  // namespace flashlab::kernels::fa3
