// The decode rung's kernels (Flash-Decoding: split-KV with a log-sum-exp combine, as the CPU
// schedule algorithms/08_split_kv_decode.hpp runs it), for sm_80 and later; decode_host.cu checks
// the arguments, picks the split count and launches them, decode_instances/ instantiates them, one
// head dim per file; decode_tiling.hpp gives the tiles.
//
// decode_kernel: one block per (chunk of keys, KV head x 16-row tile, sequence). The rows are the
// query heads of the KV head's group times the query tokens, so K and V are read once per group.
//   Q_tile once into registers (mma A fragments);
//   for each 64-key block of the chunk (K, V through a ring of cp.async stages; a paged cache
//   looks each key's page up in the block table): every warp takes 16 keys, S = Q K^T, the mask
//   (keys past the sequence; causal among the query tokens, bottom-right), the online softmax
//   (FA2 Algorithm 1 lines 9-10) and O += P V on its slice;
//   the four warps' (m, l, O) merged; one chunk: O and LSE written; several: the normalised
//   partial O and its LSE written to the workspace, and the chunk that finishes last combines
//   them (O = sum_s exp(lse_s - lse) O_s, lse = log sum_s exp(lse_s); Flash-Decoding's reduction).
// decode_append_kernel: the new keys' K and V written into the cache at cache_seqlens, before.
// With kStreamOnly the kernel moves the same bytes through the same ring with the same grid and
// computes nothing: the ceiling a decode kernel of this shape can reach.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/04_decode_sm80/decode_tiling.hpp"
#include "kernels/common/conversions.cuh"
#include "kernels/common/device_tensor.hpp"
#include "kernels/common/reductions.cuh"
#include "kernels/common/sm80.cuh"

namespace flashlab::kernels::decode {

struct DecodeParams {
  DeviceTensor q, o;  // (batch, query token, query head)
  DeviceTensor lse;   // fp32, natural log, (batch, query token, query head)
  // The cache: contiguous (batch, position, KV head), or paged (page, slot, KV head) with the
  // block table's page ids ([batch][block_table_stride] ints).
  DeviceTensor k_cache, v_cache;
  const int* block_table = nullptr;
  std::int64_t block_table_stride = 0;
  int page_size = 0;
  int page_shift = -1;  // log2(page_size) when it is a power of two: shifts instead of divisions
  const int* cache_seqlens = nullptr;  // keys in the cache before this call's append
  int seqlen_new = 0;                  // keys appended (their K and V written before this kernel)
  DeviceTensor k_new, v_new;           // (batch, new token, KV head): the append kernel's input
  int batch = 0, heads_q = 0, heads_kv = 0, group = 0, seqlen_q = 0, head_dim = 0;
  int rows = 0, row_tiles = 0;  // group * seqlen_q packed rows, in tiles of 16
  float scale_log2 = 0.f;       // softmax scale times log2(e)
  int causal = 0;
  int splits = 1, chunk_blocks = 1;  // chunks of chunk_blocks * 64 keys
  // The workspace (splits > 1): normalised partial O and base-2 LSE per chunk, and per
  // (sequence, KV head, row tile) a count of finished chunks, zero between calls.
  float* partial_o = nullptr;    // [batch][heads_kv][row_tiles][splits][16][padded head dim]
  float* partial_lse = nullptr;  // [batch][heads_kv][row_tiles][splits][16]
  int* finished = nullptr;       // [batch][heads_kv][row_tiles]
};

// Where key `key` of sequence `b` sits in the cache: (batch, position), or (page, slot) by the
// block table; looked up once for K and V.
struct CacheRow {
  int batch_or_page, position_or_slot;
};
__device__ __forceinline__ CacheRow cache_row(const DecodeParams& p, int b, int key) {
  if (p.block_table == nullptr) return {b, key};
  const int page_index = p.page_shift >= 0 ? key >> p.page_shift : key / p.page_size;
  return {__ldg(p.block_table + b * p.block_table_stride + page_index), key - page_index * p.page_size};
}
__device__ __forceinline__ std::int64_t cache_offset(const DeviceTensor& cache, CacheRow row, int head) {
  return cache.offset(row.batch_or_page, 0, row.position_or_slot, head);
}

// Row r of a tile: query head and query token.
struct PackedRow {
  int head, token;
};
__device__ __forceinline__ PackedRow packed_row(const DecodeParams& p, int head_kv, int row) {
  return {head_kv * p.group + row / p.seqlen_q, row % p.seqlen_q};
}

// ---------------------------------------------------------------------------------------------
// The append: one thread per 16 bytes of a new key's K and V row.
template <typename T>
__global__ void decode_append_kernel(const DecodeParams p) {
  const int chunks = p.head_dim / kChunkElements;
  const std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t total = static_cast<std::int64_t>(p.batch) * p.seqlen_new * p.heads_kv * chunks;
  if (index >= total) return;
  const int chunk = static_cast<int>(index % chunks);
  const int head = static_cast<int>(index / chunks % p.heads_kv);
  const int token = static_cast<int>(index / chunks / p.heads_kv % p.seqlen_new);
  const int b = static_cast<int>(index / chunks / p.heads_kv / p.seqlen_new);
  const CacheRow row = cache_row(p, b, p.cache_seqlens[b] + token);
  const int column = chunk * kChunkElements;
  const T* k_new = p.k_new.as<const T>() + p.k_new.offset(b, 0, token, head) + column;
  const T* v_new = p.v_new.as<const T>() + p.v_new.offset(b, 0, token, head) + column;
  *reinterpret_cast<uint4*>(p.k_cache.as<T>() + cache_offset(p.k_cache, row, head) + column) =
      *reinterpret_cast<const uint4*>(k_new);
  *reinterpret_cast<uint4*>(p.v_cache.as<T>() + cache_offset(p.v_cache, row, head) + column) =
      *reinterpret_cast<const uint4*>(v_new);
}

// ---------------------------------------------------------------------------------------------
// The main kernel.

// One 64-key block of K and V into a stage: each thread copies 16-byte chunks of a fixed column
// of rows row0, row0 + kRowsPerPass, ...; keys past the chunk and columns past the head dim are
// zero-filled.
template <typename T, class Tile>
__device__ __forceinline__ void load_kv_block(const DecodeParams& p, T* k_stage, T* v_stage, int b, int head_kv,
                                              int key0, int key_end) {
  using device::cp_async_16;
  using device::shared_address;
  constexpr int kChunksPerRow = Tile::kHeadDim / kChunkElements;
  constexpr int kRowsPerPass = Tile::kThreads / kChunksPerRow;
  static_assert(Tile::kThreads % kChunksPerRow == 0 && Tile::kBlockN % kRowsPerPass == 0);
  const int column = static_cast<int>(threadIdx.x) % kChunksPerRow * kChunkElements;
  const int row0 = static_cast<int>(threadIdx.x) / kChunksPerRow;
  const bool column_valid = column < p.head_dim;
#pragma unroll
  for (int pass = 0; pass < Tile::kBlockN / kRowsPerPass; ++pass) {
    const int row = row0 + pass * kRowsPerPass, key = key0 + row;
    const bool valid = column_valid && key < key_end;
    const T* k_source = p.k_cache.as<const T>();
    const T* v_source = p.v_cache.as<const T>();
    if (valid) {
      const CacheRow cached = cache_row(p, b, key);
      k_source += cache_offset(p.k_cache, cached, head_kv) + column;
      v_source += cache_offset(p.v_cache, cached, head_kv) + column;
    }
    cp_async_16(shared_address(k_stage + row * Tile::kRowStride + column), k_source, valid);
    cp_async_16(shared_address(v_stage + row * Tile::kRowStride + column), v_source, valid);
  }
}

template <typename T, int kHeadDim, bool kStreamOnly>
__global__ void __launch_bounds__(DecodeTiling<kHeadDim>::kThreads) decode_kernel(const DecodeParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace device;
  using Tile = DecodeTiling<kHeadDim>;
  constexpr int kBlockN = Tile::kBlockN, kRowStride = Tile::kRowStride, kSteps = kHeadDim / 16;
  extern __shared__ __align__(16) unsigned char shared[];
  T* ring = reinterpret_cast<T*>(shared);
  T* q_tile = ring + Tile::kStages * 2 * kBlockN * kRowStride;
  auto k_stage = [&](int stage) { return ring + stage * 2 * kBlockN * kRowStride; };
  auto v_stage = [&](int stage) { return ring + (stage * 2 + 1) * kBlockN * kRowStride; };

  const int split = blockIdx.x, head_kv = blockIdx.y / p.row_tiles, row_tile = blockIdx.y % p.row_tiles, b = blockIdx.z;
  const int keys = p.cache_seqlens[b] + p.seqlen_new;  // this sequence's keys, the new ones included
  const int chunk_keys = p.chunk_blocks * kBlockN;
  const int active_splits = keys > 0 ? (keys + chunk_keys - 1) / chunk_keys : 1;  // an empty cache still writes O
  if (split >= active_splits) return;
  const int key_begin = split * chunk_keys, key_end = min(keys, key_begin + chunk_keys);
  const int blocks = (key_end - key_begin + kBlockN - 1) / kBlockN;
  const int tile_rows = min(Tile::kBlockRows, p.rows - row_tile * Tile::kBlockRows);

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;

  // Q_tile (rows past the group, columns past the head dim zero-filled) and the first K, V blocks.
  {
    constexpr int kChunksPerRow = kHeadDim / kChunkElements;
    for (int index = threadIdx.x; index < Tile::kBlockRows * kChunksPerRow; index += Tile::kThreads) {
      const int row = index / kChunksPerRow, column = index % kChunksPerRow * kChunkElements;
      const bool valid = row < tile_rows && column < p.head_dim;
      const T* source = p.q.as<const T>();
      if (valid) {
        const PackedRow packed = packed_row(p, head_kv, row_tile * Tile::kBlockRows + row);
        source += p.q.offset(b, 0, packed.token, packed.head) + column;
      }
      cp_async_16(shared_address(q_tile + row * kRowStride + column), source, valid);
    }
    cp_async_commit();
  }
#pragma unroll
  for (int stage = 0; stage < Tile::kStages - 1; ++stage) {
    if (stage < blocks) load_kv_block<T, Tile>(p, k_stage(stage), v_stage(stage), b, head_kv, key_begin + stage * kBlockN, key_end);
    cp_async_commit();
  }

  // This warp's state for the 16 rows: rows g and g + 8 of its mma fragments.
  std::uint32_t q_fragment[kSteps][4];
  float o[kHeadDim / 8][4];
  float running_max[2] = {-INFINITY, -INFINITY}, running_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int n = 0; n < kHeadDim / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  cp_async_wait<Tile::kStages - 1>();  // Q_tile
  __syncthreads();
  if constexpr (!kStreamOnly) {
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {
      const int matrix = lane / 8;
      ldmatrix_x4(q_fragment[k], shared_address(q_tile + (matrix % 2 * 8 + lane % 8) * kRowStride + k * 16 + matrix / 2 * 8));
    }
  }
  // Causal among the query tokens: token i sees keys j <= i + keys - seqlen_q (bottom-right).
  const int first_hidden_key = p.causal ? keys - p.seqlen_q + 1 : keys;

  for (int block = 0; block < blocks; ++block) {
    cp_async_wait<Tile::kStages - 2>();
    __syncthreads();  // block's stage has landed; every warp is done with block - 1's stage
    const int next = block + Tile::kStages - 1;
    if (next < blocks) {
      load_kv_block<T, Tile>(p, k_stage(next % Tile::kStages), v_stage(next % Tile::kStages), b, head_kv,
                             key_begin + next * kBlockN, key_end);
    }
    cp_async_commit();
    if constexpr (kStreamOnly) continue;

    const T* k_tile = k_stage(block % Tile::kStages);
    const T* v_tile = v_stage(block % Tile::kStages);
    const int key0 = key_begin + block * kBlockN + 16 * warp;  // this warp's 16 keys

    // S = Q K^T on the warp's 16 keys (two n8 tiles), in base 2 with the scale folded in.
    float s[2][4] = {};
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {
      const int matrix = lane / 8;
      std::uint32_t kf[4];
      ldmatrix_x4(kf, shared_address(k_tile + (16 * warp + matrix / 2 * 8 + lane % 8) * kRowStride + k * 16 + matrix % 2 * 8));
      mma_16816<T>(s[0], q_fragment[k], kf[0], kf[1]);
      mma_16816<T>(s[1], q_fragment[k], kf[2], kf[3]);
    }
    const bool needs_mask = key0 + 16 > min(key_end, first_hidden_key);
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] *= p.scale_log2;
        if (needs_mask) {
          const int key = key0 + 8 * n + 2 * t + e % 2, row = row_tile * Tile::kBlockRows + g + 8 * (e / 2);
          const int token = row % p.seqlen_q;
          if (key >= key_end || (p.causal && key > token + keys - p.seqlen_q)) s[n][e] = -INFINITY;
        }
      }

    // The online softmax (FA2 Algorithm 1, line 9): new max, rescale, P = exp2(S - m).
    std::uint32_t pa[4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float block_max = fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1]));
      block_max = quad_reduce(block_max, [](float a, float c) { return fmaxf(a, c); });
      const float new_max = fmaxf(running_max[r], block_max);
      const float base = new_max == -INFINITY ? 0.f : new_max;  // a row with no key yet stays at 0
      const float rescale = exp2f(running_max[r] - base);
      running_max[r] = new_max;
      running_sum[r] *= rescale;
#pragma unroll
      for (int n = 0; n < kHeadDim / 8; ++n) o[n][2 * r] *= rescale, o[n][2 * r + 1] *= rescale;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        s[n][2 * r] = exp2f(s[n][2 * r] - base);
        s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] - base);
        running_sum[r] += s[n][2 * r] + s[n][2 * r + 1];
      }
    }
    pa[0] = pack2<T>(s[0][0], s[0][1]), pa[1] = pack2<T>(s[0][2], s[0][3]);
    pa[2] = pack2<T>(s[1][0], s[1][1]), pa[3] = pack2<T>(s[1][2], s[1][3]);

    // Line 10: O += P V on the warp's 16 keys (V's rows transposed by ldmatrix).
#pragma unroll
    for (int pair = 0; pair < kHeadDim / 16; ++pair) {
      const int matrix = lane / 8;
      std::uint32_t vf[4];
      ldmatrix_x4_trans(vf, shared_address(v_tile + (16 * warp + matrix % 2 * 8 + lane % 8) * kRowStride + pair * 16 + matrix / 2 * 8));
      mma_16816<T>(o[2 * pair], pa, vf[0], vf[1]);
      mma_16816<T>(o[2 * pair + 1], pa, vf[2], vf[3]);
    }
  }
  if constexpr (kStreamOnly) {
    cp_async_wait<0>();
    return;
  }

  // The chunk's end: the warps' (m, l, O) through shared memory (the ring is free again).
  cp_async_wait<0>();
  __syncthreads();
  constexpr int kMergeStride = Tile::kMergeRowFloats;  // floats per row, padded against bank conflicts
  float* merge_o = reinterpret_cast<float*>(shared);                           // [warp][16][kMergeStride]
  float* merge_max = merge_o + Tile::kWarps * Tile::kBlockRows * kMergeStride;  // [warp][16]
  float* merge_sum = merge_max + Tile::kWarps * Tile::kBlockRows;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    running_sum[r] = quad_reduce(running_sum[r], [](float a, float c) { return a + c; });
    const int row = g + 8 * r;
    if (t == 0) merge_max[warp * 16 + row] = running_max[r], merge_sum[warp * 16 + row] = running_sum[r];
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
      *reinterpret_cast<float2*>(merge_o + (warp * 16 + row) * kMergeStride + 8 * n + 2 * t) = make_float2(o[n][2 * r], o[n][2 * r + 1]);
    }
  }
  __syncthreads();

  // Each thread: one row, kHeadDim / 8 columns. The chunk's (normalised O, base-2 LSE).
  constexpr int kColumns = kHeadDim / 8;
  const int row = threadIdx.x / 8, column0 = threadIdx.x % 8 * kColumns;
  float chunk_max = -INFINITY;
#pragma unroll
  for (int w = 0; w < Tile::kWarps; ++w) chunk_max = fmaxf(chunk_max, merge_max[w * 16 + row]);
  float weight[Tile::kWarps], chunk_sum = 0.f;
#pragma unroll
  for (int w = 0; w < Tile::kWarps; ++w) {
    weight[w] = chunk_max == -INFINITY ? 0.f : exp2f(merge_max[w * 16 + row] - chunk_max);
    chunk_sum += weight[w] * merge_sum[w * 16 + row];
  }
  const float inverse_sum = chunk_sum > 0.f ? 1.f / chunk_sum : 0.f;  // a row that saw no key: O = 0
  const float chunk_lse = chunk_sum > 0.f ? chunk_max + log2f(chunk_sum) : -INFINITY;
  float out[kColumns];
#pragma unroll
  for (int c = 0; c < kColumns; ++c) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < Tile::kWarps; ++w) sum += weight[w] * merge_o[(w * 16 + row) * kMergeStride + column0 + c];
    out[c] = sum * inverse_sum;
  }

  const bool row_valid = row < tile_rows;
  const PackedRow packed = packed_row(p, head_kv, row_tile * Tile::kBlockRows + min(row, tile_rows - 1));
  auto write_output = [&](const float (&values)[kColumns], float lse_log2) {
    if (!row_valid) return;
    T* destination = p.o.as<T>() + p.o.offset(b, 0, packed.token, packed.head);
#pragma unroll
    for (int c = 0; c < kColumns; c += 2) {
      if (column0 + c < p.head_dim) *reinterpret_cast<std::uint32_t*>(destination + column0 + c) = pack2<T>(values[c], values[c + 1]);
    }
    if (column0 == 0) p.lse.as<float>()[p.lse.offset(b, 0, packed.token, packed.head)] = lse_log2 * kLn2Float;
  };
  if (active_splits == 1) {
    write_output(out, chunk_lse);
    return;
  }

  // Several chunks: this one's part to the workspace; the last to finish combines them.
  const std::int64_t unit = (static_cast<std::int64_t>(b) * p.heads_kv + head_kv) * p.row_tiles + row_tile;
  float* partial_o = p.partial_o + unit * p.splits * Tile::kBlockRows * kHeadDim;
  float* partial_lse = p.partial_lse + unit * p.splits * Tile::kBlockRows;
  if (row_valid) {
#pragma unroll
    for (int c = 0; c < kColumns; c += 4) {
      *reinterpret_cast<float4*>(partial_o + (split * Tile::kBlockRows + row) * kHeadDim + column0 + c) =
          make_float4(out[c], out[c + 1], out[c + 2], out[c + 3]);
    }
    if (column0 == 0) partial_lse[split * Tile::kBlockRows + row] = chunk_lse;
  }
  __threadfence();  // this chunk's part is visible to the GPU before it counts itself finished
  __syncthreads();
  __shared__ int is_last;
  if (threadIdx.x == 0) {
    is_last = atomicAdd(p.finished + unit, 1) == active_splits - 1;
    if (is_last) p.finished[unit] = 0;  // zero again for the next call
  }
  __syncthreads();
  if (!is_last || !row_valid) return;
  __threadfence();
  float lse_max = -INFINITY;
  for (int s = 0; s < active_splits; ++s) lse_max = fmaxf(lse_max, __ldcg(partial_lse + s * Tile::kBlockRows + row));
  float total = 0.f;
#pragma unroll
  for (int c = 0; c < kColumns; ++c) out[c] = 0.f;
  for (int s = 0; s < active_splits; ++s) {
    const float lse_s = __ldcg(partial_lse + s * Tile::kBlockRows + row);
    const float w = lse_max == -INFINITY ? 0.f : exp2f(lse_s - lse_max);
    total += w;
#pragma unroll
    for (int c = 0; c < kColumns; c += 4) {
      const float4 part = __ldcg(reinterpret_cast<const float4*>(partial_o + (s * Tile::kBlockRows + row) * kHeadDim + column0 + c));
      out[c] += w * part.x, out[c + 1] += w * part.y, out[c + 2] += w * part.z, out[c + 3] += w * part.w;
    }
  }
  const float inverse_total = total > 0.f ? 1.f / total : 0.f;
#pragma unroll
  for (int c = 0; c < kColumns; ++c) out[c] *= inverse_total;
  write_output(out, total > 0.f ? lse_max + log2f(total) : -INFINITY);
#else
  (void)p;
  __trap();
#endif
}

// Launches the append (when there are new keys) and the main kernel for one instance.
template <typename T, int kHeadDim>
void launch_decode(const DecodeParams& params, bool stream_only, cudaStream_t stream);
// The blocks of the main kernel that fit one SM (for the split count).
template <typename T, int kHeadDim>
int decode_blocks_per_sm();

}  // namespace flashlab::kernels::decode
