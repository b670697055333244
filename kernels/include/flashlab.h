/* flashlab.h: the public C ABI of libflashlab_kernels_c (kernels/c_api.cpp), the host API of
 * attention_api.hpp for Python (the flashlab package loads it with ctypes: python/flashlab/_abi.py)
 * or any other language. Plain C: integers, doubles and pointers. The library exports these
 * functions and nothing else (tests/abi/exported_symbols.sh holds it to that).
 *
 * Versions. FLASHLAB_ABI_VERSION is the version of this header; flashlab_abi_version() that of
 * the library. A caller that mirrors the declarations below (a binding in another language)
 * checks that the two are equal before any other call: any change to a declaration, a struct
 * field or the meaning of a code bumps the version.
 *   1: the first versioned ABI. Every entry that launches work takes the stream it runs on
 *      (a cudaStream_t as void*; NULL is the legacy default stream) and runs on the current
 *      CUDA device.
 *   2: flashlab_backward takes the generation first (2 = FA2, 3 = FA3 on Hopper), as
 *      flashlab_forward does.
 *   3: decoding against a KV cache: FlashlabKvCache, flashlab_decode and
 *      flashlab_decode_workspace_bytes.
 *
 * Every entry returns FLASHLAB_OK, FLASHLAB_REFUSED when an input breaks the contract below (the
 * message of flashlab_last_error() names the input and the allowed range; nothing was launched)
 * or FLASHLAB_ERROR for a CUDA error (no device, out of memory, a failed launch) or an internal
 * one. Every input is checked before any CUDA call, so such a refusal needs no GPU; only what
 * depends on the device (its compute capability, the shared memory a head dim needs) is refused
 * after asking it. No exception crosses the ABI.
 *
 * The contract:
 * - problem is non-null. dtype: 1 = fp16, 2 = bf16. causal: 0 or 1. alignment: 0 = top-left,
 *   1 = bottom-right. window bounds: -1 (unbounded) or [0, max(seqlen_q, seqlen_k)].
 *   softmax_scale: 0 (1 / sqrt(head_dim)) or a float-representable positive value (up to FLT_MAX / 2).
 *   Shapes and the rest as flashlab::Problem::validate and each kernel allow.
 * - Varlen: cu_seqlens_q_host and cu_seqlens_k_host are both null (a dense batch) or both point to
 *   batch + 1 ints; the ABI reads exactly batch + 1 entries of each (it cannot know an array's
 *   length: a shorter array is the caller's error and is read past its end). They start at 0 and
 *   grow by each sequence's length, in [1, seqlen_q] (queries) and [1, seqlen_k] (keys):
 *   seqlen_q and seqlen_k are the longest sequences or more. cu_seqlens_*_device are device copies
 *   of the same values, given exactly when the host arrays are (the ABI cannot read device memory:
 *   that they match is the caller's promise).
 * - Tensors: a device pointer and a pointer to three int64 strides in elements, (batch, row, head);
 *   element (b, position, head, col) is at data[b * batch_stride + position * row_stride +
 *   head * head_stride + col] (varlen: position is the packed row and batch_stride is ignored).
 *   The stride arrays are non-null; a stride is positive wherever its extent exceeds 1 and the
 *   highest byte offset fits in int64 and the address space; the kernels' alignment rules apply.
 * - Outputs (o, lse; dq, dk, dv; c) have every element in memory of its own and share no memory
 *   with any other argument (interleaved but disjoint views of one buffer, as a packed dqkv, are
 *   fine when they have the same strides and shape).
 * - Flags (ping_pong, intra_warpgroup_overlap, persistent, deterministic): 0 or 1.
 */
#ifndef FLASHLAB_H
#define FLASHLAB_H

#include <stdint.h>

#define FLASHLAB_ABI_VERSION 3

/* What the shared library exports (everything else in it has hidden visibility). */
#if defined(__GNUC__) || defined(__clang__)
#define FLASHLAB_API __attribute__((visibility("default")))
#else
#define FLASHLAB_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum { FLASHLAB_OK = 0, FLASHLAB_ERROR = 1, FLASHLAB_REFUSED = 2 };

typedef struct FlashlabProblem {
  int dtype;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  double softmax_scale;
  int causal, alignment, window_left, window_right;
  const int* cu_seqlens_q_host;
  const int* cu_seqlens_k_host;
  const int* cu_seqlens_q_device;
  const int* cu_seqlens_k_device;
} FlashlabProblem;

/* The library's FLASHLAB_ABI_VERSION. Needs no device, never fails. */
FLASHLAB_API int flashlab_abi_version(void);

/* The message of this thread's last call (empty after a success). */
FLASHLAB_API const char* flashlab_last_error(void);

/* 1 when the library holds device code for the generation (1 FA1, 2 FA2: always; 3 FA3: a build
 * whose CUDA architectures include 90a), 0 when it does not, -1 for a code that is no generation
 * (flashlab_last_error() names it). Needs no device. */
FLASHLAB_API int flashlab_generation_built(int generation);

/* generation: 1 = FA1 forward, 2 = FA2 forward, 3 = FA3 forward (Hopper). lse: fp32, one column. */
FLASHLAB_API int flashlab_forward(int generation, const FlashlabProblem* problem, void* q, const int64_t* q_strides,
                                  void* k, const int64_t* k_strides, void* v, const int64_t* v_strides, void* o,
                                  const int64_t* o_strides, float* lse, const int64_t* lse_strides, void* stream);

/* The FA3 forward with some of its steps off, for the ablation. */
FLASHLAB_API int flashlab_fa3_forward_steps(int ping_pong, int intra_warpgroup_overlap, int persistent,
                                            const FlashlabProblem* problem, void* q, const int64_t* q_strides,
                                            void* k, const int64_t* k_strides, void* v, const int64_t* v_strides,
                                            void* o, const int64_t* o_strides, float* lse,
                                            const int64_t* lse_strides, void* stream);

/* The Hopper rung's GEMM: C [m, n] = A [m, k] B [n, k]^T, bf16, contiguous row-major. */
FLASHLAB_API int flashlab_sm90_gemm_bf16(const void* a, const void* b, void* c, int m, int n, int k, void* stream);

/* generation: 2 = FA2 backward, 3 = FA3 backward (Hopper; head_dim up to 128): dQ, dK, dV from Q, K,
 * V, O, LSE and dO (workspace allocated by the call). */
FLASHLAB_API int flashlab_backward(int generation, const FlashlabProblem* problem, int deterministic, void* q,
                                   const int64_t* q_strides, void* k, const int64_t* k_strides, void* v,
                                   const int64_t* v_strides, void* o, const int64_t* o_strides, float* lse,
                                   const int64_t* lse_strides, void* d_o, const int64_t* d_o_strides, void* dq,
                                   const int64_t* dq_strides, void* dk, const int64_t* dk_strides, void* dv,
                                   const int64_t* dv_strides, void* stream);

/* A KV cache for flashlab_decode (the host API's DecodeArgs, kernels/attention_api.hpp):
 * contiguous (block_table null; k_cache and v_cache (batch, position, KV head) with problem->seqlen_k
 * positions, page fields 0) or paged ((page, slot, KV head): num_pages pages of page_size slots,
 * 16, 32, 64, 128, 192 or 256; block_table: batch x max_pages_per_sequence page ids on the device;
 * problem->seqlen_k = max_pages_per_sequence * page_size). cache_seqlens: batch ints on the device,
 * the keys cached before this call. k_new, v_new: seqlen_new new tokens per sequence (batch,
 * token, KV head), appended at cache_seqlens (null with seqlen_new 0). host_cache_seqlens and
 * host_block_table: host copies, read before any launch (lengths within the cache and page ids
 * within num_pages, or the call is refused), or null: unchecked. */
typedef struct FlashlabKvCache {
  void* k_cache;
  const int64_t* k_cache_strides;
  void* v_cache;
  const int64_t* v_cache_strides;
  const int* block_table;
  int max_pages_per_sequence, num_pages, page_size;
  const int* cache_seqlens;
  void* k_new;
  const int64_t* k_new_strides;
  void* v_new;
  const int64_t* v_new_strides;
  int seqlen_new;
  const int* host_cache_seqlens;
  const int* host_block_table;
} FlashlabKvCache;

/* Decoding (the decode rung): problem->seqlen_q query tokens (1..16) per sequence, causal
 * bottom-right or not, against the cache; q, o (batch, token, query head); lse fp32 (batch,
 * token, query head). num_splits: 0 (chosen for the device) or 1..256 chunks per sequence.
 * workspace: workspace_bytes of device memory (at least flashlab_decode_workspace_bytes) whose
 * first bytes are zero on entry (left zero on return: zero it once), or null (allocated and
 * zeroed by the call). stream_only 1: the kernel's loads alone (no output, no append), the
 * ceiling of the benchmark. */
FLASHLAB_API int flashlab_decode(const FlashlabProblem* problem, const FlashlabKvCache* cache, int num_splits, void* q,
                                 const int64_t* q_strides, void* o, const int64_t* o_strides, float* lse,
                                 const int64_t* lse_strides, void* workspace, int64_t workspace_bytes,
                                 int stream_only, void* stream);

/* The workspace flashlab_decode needs with these arguments on the current device, in *bytes. */
FLASHLAB_API int flashlab_decode_workspace_bytes(const FlashlabProblem* problem, const FlashlabKvCache* cache,
                                                 int num_splits, int64_t* bytes);

#ifdef __cplusplus
}
#endif

#endif /* FLASHLAB_H */
