// Lab 06: FlashAttention-2's forward pass as a CUDA kernel (Dao 2023, Algorithm 1).
//
// One thread block per (query block, head, batch): grid (ceil(seqlen_q / kBlockM), heads_q, batch).
// Thread t of a block owns query row row_begin + t: its running max m and sum l and its output row
// O in registers, and its scores for the current key block. The block's Q rows are loaded into
// shared memory once; K and V then pass through shared memory one block of kBlockN keys at a time,
// loaded by all threads together. fp16 or bf16 in and out, fp32 arithmetic, LSE in fp32.
//
// What you write (each marked TODO n and LAB06_TODO(n): delete the LAB06_TODO line when done):
//   TODO 1  the loop over key blocks (Algorithm 1, lines 6-8): the last block is narrower, and
//           with a causal mask the loop stops after the last key the block's rows can see;
//   TODO 2  the online-softmax update (lines 9-10): the new max, the rescale of l and O, P and
//           l and O += P V;
//   TODO 3  the causal mask's edge: the last key a query sees, in either alignment.
// Everything else is given: the layouts, the loads, the scores, the final normalisation and LSE
// (lines 12-13), the launch, and the host function the grader calls.
//
// Grade it:  flashlab-grade 06 attention.cu      (nvcc compiles it; the checks run on a GPU)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

// The grader looks for these markers: delete each one when the part it marks is written.
#define LAB06_TODO(part)

// ------------------------------------------------------------------------------------------------
// The problem and its layouts (given)

constexpr int kBlockM = 64;  // query rows per thread block, one thread each
constexpr int kBlockN = 32;  // keys per K/V block in shared memory

// Q, O [batch, seqlen_q, heads_q, head_dim] and K, V [batch, seqlen_k, heads_kv, head_dim], each
// contiguous, fp16 or bf16; LSE [batch, seqlen_q, heads_q] in fp32 (natural log). Query head h
// reads key/value head h / (heads_q / heads_kv) (GQA; heads_kv = heads_q is MHA).
struct AttentionProblem {
  bool bf16;  // false: fp16
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  float softmax_scale;  // multiplies Q K^T
  bool causal;
  bool bottom_right;  // the causal mask's alignment: bottom-right (as flash-attention) or top-left
};

struct ForwardArgs {
  AttentionProblem problem;
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
};

// Shared-memory rows are padded by two elements: threads reading their own rows of a tile then
// read different banks.
template <int kHeadDim>
constexpr int kSharedStride = kHeadDim + 2;

__device__ inline float to_float(__half x) { return __half2float(x); }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ inline T from_float(float x);
template <>
__device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// ------------------------------------------------------------------------------------------------
// TODO 3: the causal mask's edge.
// The last key that `query` sees: seqlen_k - 1 without a mask. With causal, the diagonal:
// bottom-right alignment sees keys j <= query + (seqlen_k - seqlen_q), top-left keys j <= query.
// Negative when the query sees no key at all (bottom-right with seqlen_q > seqlen_k).
__device__ inline int last_visible_key(const AttentionProblem& p, int query) {
  LAB06_TODO(3);
  return p.seqlen_k - 1;
}

__device__ inline bool key_visible(const AttentionProblem& p, int query, int key) {
  return key <= last_visible_key(p, query);
}

// ------------------------------------------------------------------------------------------------
// Loads and scores (given)

// Rows [0, rows) of a tile from global memory (a row every row_stride elements) into shared
// memory, zeros in rows [rows, kTileRows). Every thread of the block takes part; a thread reads
// consecutive columns of a row, so a warp reads contiguous memory.
template <typename T, int kHeadDim, int kTileRows>
__device__ void load_tile(T* tile, const T* global, std::int64_t row_stride, int rows) {
  for (int i = threadIdx.x; i < kTileRows * kHeadDim; i += blockDim.x) {
    const int row = i / kHeadDim, col = i % kHeadDim;
    tile[row * kSharedStride<kHeadDim> + col] = row < rows ? global[row * row_stride + col] : from_float<T>(0.f);
  }
}

// Line 8 for one query row: s[j] = softmax_scale * q . k_j for the block's keys, -inf for a key
// the query does not see and for the rows of the block past its last key (j >= keys_in_block).
template <typename T, int kHeadDim>
__device__ void score_block(const AttentionProblem& p, const T* q_row, const T* k_tile, int query, int key_start,
                            int keys_in_block, float (&s)[kBlockN]) {
  for (int j = 0; j < kBlockN; ++j) {
    float dot = 0.f;
#pragma unroll 16
    for (int c = 0; c < kHeadDim; ++c) dot += to_float(q_row[c]) * to_float(k_tile[j * kSharedStride<kHeadDim> + c]);
    const bool visible = j < keys_in_block && key_visible(p, query, key_start + j);
    s[j] = visible ? dot * p.softmax_scale : -INFINITY;
  }
}

// ------------------------------------------------------------------------------------------------
// TODO 2: the online-softmax update, Algorithm 1 lines 9-10, for one query row.
// Given the block's scores s (-inf where masked) and its values v_tile (row j is key j's), fold
// the block into the row's state: m_new = max(m, max_j s[j]); the sums so far were taken against
// m, so l and o are first multiplied by exp(m - m_new); then p_j = exp(s[j] - m_new),
// l += sum_j p_j, o += sum_j p_j v_j; and m = m_new. O stays unnormalised: the division by l comes
// once, after the last block (given, in the kernel). A row that has seen no visible key yet
// (m_new = -inf) has nothing to add: exp(-inf - -inf) would be NaN.
template <typename T, int kHeadDim>
__device__ void online_softmax_update(const float (&s)[kBlockN], const T* v_tile, float& m, float& l,
                                      float (&o)[kHeadDim]) {
  LAB06_TODO(2);
  // Keep o[c] loops unrolled (#pragma unroll), so that o stays in registers.
}

// ------------------------------------------------------------------------------------------------
// The kernel

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kBlockM) attention_forward_kernel(const ForwardArgs args) {
  const AttentionProblem& p = args.problem;
  constexpr int kStride = kSharedStride<kHeadDim>;
  __shared__ T q_tile[kBlockM * kStride];
  __shared__ T k_tile[kBlockN * kStride];
  __shared__ T v_tile[kBlockN * kStride];

  const int row_begin = blockIdx.x * kBlockM, head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / (p.heads_q / p.heads_kv);  // GQA: a group of query heads shares K, V
  const int query = row_begin + threadIdx.x;            // this thread's row
  const int rows_in_block = min(kBlockM, p.seqlen_q - row_begin);

  // Row r of Q is (batch, r, head): consecutive rows are heads_q * head_dim elements apart.
  const std::int64_t q_row_stride = std::int64_t(p.heads_q) * kHeadDim;
  const std::int64_t kv_row_stride = std::int64_t(p.heads_kv) * kHeadDim;
  const T* q = static_cast<const T*>(args.q) + (std::int64_t(batch) * p.seqlen_q + row_begin) * q_row_stride +
               head * kHeadDim;
  const T* k = static_cast<const T*>(args.k) + std::int64_t(batch) * p.seqlen_k * kv_row_stride + kv_head * kHeadDim;
  const T* v = static_cast<const T*>(args.v) + std::int64_t(batch) * p.seqlen_k * kv_row_stride + kv_head * kHeadDim;

  load_tile<T, kHeadDim, kBlockM>(q_tile, q, q_row_stride, rows_in_block);  // line 4: Q_i into shared memory

  float o[kHeadDim];  // line 5: O_i = 0, l_i = 0, m_i = -inf, this row's in registers
#pragma unroll
  for (int c = 0; c < kHeadDim; ++c) o[c] = 0.f;
  float m = -INFINITY, l = 0.f;

  // TODO 1: the loop over key blocks (lines 6-8). Key blocks start at 0, kBlockN, 2 kBlockN, ...;
  // the last one holds keys_in_block = min(kBlockN, seqlen_k - key_start) keys. With a causal
  // mask, stop after the last key the block's last row (row_begin + rows_in_block - 1) sees:
  // last_visible_key(p, that row) + 1 (seqlen_k without a mask); the blocks after it are hidden
  // entirely, and FA2 skips them. Per block:
  // wait until every thread is done with the previous K and V (__syncthreads), load K_j and V_j
  // (load_tile; line 7), wait until they are in (__syncthreads), score the block (score_block;
  // line 8) into a float s[kBlockN], and fold it in (online_softmax_update; lines 9-10).
  LAB06_TODO(1);

  // Lines 12-13 (given): O_i = diag(l)^-1 O_i, LSE_i = m + log(l); a row that saw no key gets
  // O = 0 and LSE = -inf.
  if (query < p.seqlen_q) {
    const std::int64_t row = std::int64_t(batch) * p.seqlen_q + query;
    T* o_row = static_cast<T*>(args.o) + row * q_row_stride + head * kHeadDim;
    const float inverse_l = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int c = 0; c < kHeadDim; ++c) o_row[c] = from_float<T>(o[c] * inverse_l);
    args.lse[row * p.heads_q + head] = l > 0.f ? m + logf(l) : -INFINITY;
  }
}

// ------------------------------------------------------------------------------------------------
// The launch (given): the host function the grader calls, with device pointers in the layouts
// above and the stream to run on. Returns nullptr once the kernel is launched, or a message
// naming what this kernel does not support (nothing launched).

template <typename T, int kHeadDim>
void launch(const ForwardArgs& args, cudaStream_t stream) {
  const AttentionProblem& p = args.problem;
  const dim3 grid((p.seqlen_q + kBlockM - 1) / kBlockM, p.heads_q, p.batch);
  attention_forward_kernel<T, kHeadDim><<<grid, kBlockM, 0, stream>>>(args);
}

const char* attention_forward(const ForwardArgs& args, cudaStream_t stream) {
  const AttentionProblem& p = args.problem;
  if (p.head_dim != 64 && p.head_dim != 128) return "head_dim: allowed 64 or 128";
  if (p.heads_kv < 1 || p.heads_q % p.heads_kv != 0) return "heads_q: allowed a multiple of heads_kv";
  if (p.head_dim == 64) {
    p.bf16 ? launch<__nv_bfloat16, 64>(args, stream) : launch<__half, 64>(args, stream);
  } else {
    p.bf16 ? launch<__nv_bfloat16, 128>(args, stream) : launch<__half, 128>(args, stream);
  }
  return nullptr;
}
