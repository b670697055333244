// The host API shared by every rung of the kernel ladder (kernels/README.md). A kernel takes the
// same problem description as the CPU schedules (flashlab::Problem: shapes, masks, dtype, varlen
// offsets) plus device pointers with their strides and a stream. What a kernel cannot do is
// refused with std::invalid_argument naming the unsupported input and what is allowed: there is
// no silent fallback to another kernel or another precision.
//
// Layouts. A tensor is a DeviceTensor (kernels/common/device_tensor.hpp, the type every kernel's
// parameters hold too), addressed as
//   data[batch_index * batch_stride + position * row_stride + head * head_stride + column]
// in elements (the last dimension is contiguous). For variable-length batches (problem.varlen())
// position is the packed row (cu_seqlens[b] + i) and batch_stride is ignored. The defaults made by
// flash_layout() are the flash-attention layout [batch * seqlen, heads, dim]; a PyTorch tensor in
// [batch, heads, seqlen, dim] is described by its own strides.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "algorithms/problem.hpp"
#include "kernels/common/device_tensor.hpp"

namespace flashlab::kernels {

// The flash-attention layout [rows, heads, dim] (rows = batch * seqlen, or packed for varlen).
DeviceTensor flash_layout(void* data, const Problem& problem, int heads, int dim, bool is_query_side);

// Forward pass: O = softmax(scale * Q K^T + mask) V and LSE = log(sum(exp(...))) per query row
// (natural log; -inf and O = 0 for a fully masked row).
struct ForwardArgs {
  DeviceTensor q, k, v, o;
  DeviceTensor lse;  // fp32; may have data == nullptr when the caller does not need it (FA1 only)
  // Device copies of problem.cu_seqlens_q / cu_seqlens_k (batch + 1 ints each) for varlen problems;
  // required then, ignored otherwise.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  // Scratch for kernels that keep state in HBM (FA1: O in fp32, m, l). nullptr: the call
  // allocates it stream-ordered (cudaMallocAsync) and frees it after the kernel.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};

// Backward pass (FA2 Algorithm 2): dQ, dK, dV from Q, K, V, O, LSE (from the forward) and dO.
struct BackwardArgs {
  DeviceTensor q, k, v, o, lse, d_o;
  DeviceTensor dq, dk, dv;
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  // true: dQ accumulated in a fixed order, bitwise repeatable; false: fp32 atomics (faster).
  bool deterministic = false;
  // Scratch (D = rowsum(dO * O), the fp32 dQ accumulator, ...); size from
  // fa2_backward_workspace_bytes(). nullptr: allocated stream-ordered by the call.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Rung 1 (kernels/01_fa1_sm75/): FA1 Algorithm 1. One thread block per (batch, head),
// K/V blocks in the outer loop, Q blocks in the inner loop, O, l and m re-read and re-written in
// HBM. fp16 only, head_dim <= 128, compute capability >= 7.5 (mma.sync m16n8k8 on sm_75).
void fa1_forward(const Problem& problem, const ForwardArgs& args);
std::size_t fa1_forward_workspace_bytes(const Problem& problem);

// Rung 2 (kernels/02_fa2_sm80/forward_*): FA2 forward. bf16 and fp16, head_dim 32..256 in
// multiples of 8, causal (both alignments), sliding windows, GQA/MQA, varlen. cc >= 8.0.
// The tiling of head dims above 128 depends on the shared memory a block may take (an A100's
// 163 KB, a Hopper's 227 KB): fa2_forward_within picks it for a device whose limit is
// min(shared_bytes_limit, this device's), which lets the tests run an A100's tiling on a Hopper.
void fa2_forward(const Problem& problem, const ForwardArgs& args);
void fa2_forward_within(const Problem& problem, const ForwardArgs& args, int shared_bytes_limit);

// Rung 2 backward (kernels/02_fa2_sm80/backward_*): FA2 Algorithm 2.
void fa2_backward(const Problem& problem, const BackwardArgs& args);
std::size_t fa2_backward_workspace_bytes(const Problem& problem, bool deterministic);

// Generation 3 (kernels/03_fa3_sm90/): the FA3 forward on Hopper: TMA, wgmma, a producer
// warpgroup feeding consumer warpgroups, ping-pong, intra-warpgroup overlap, a persistent grid.
// bf16 and fp16, head_dim multiples of 8 in [8, 256] (instances for 64, 96, 128, 192, 256),
// causal (both alignments), sliding windows, GQA/MQA, varlen. Compute capability exactly 9.0,
// and a build with sm_90a code; LSE is always written. The workspace holds the persistent grid's
// tile counter (fa3_forward_workspace_bytes; nullptr: allocated stream-ordered by the call).
void fa3_forward(const Problem& problem, const ForwardArgs& args);
std::size_t fa3_forward_workspace_bytes(const Problem& problem);

// The FA3 forward's techniques, one switch each (the ablation of docs/kernels.md). Warp
// specialization (a TMA producer warpgroup feeding consumer warpgroups) is always on. The
// persistent grid is off by default: on the H200 it measured slower than one block per tile
// (docs/kernels.md), so fa3_forward runs the default below.
struct Fa3Steps {
  bool ping_pong = true;                // consumer warpgroups take turns issuing their GEMMs
  bool intra_warpgroup_overlap = true;  // the softmax of block j while S_{j+1} and P_j V_j run
  bool persistent = false;              // one block per SM walks the tiles (causal: longest first)
  constexpr bool operator==(const Fa3Steps&) const = default;
};
// fa3_forward with other steps: the default, or at head_dim 128 in bf16 the ablation's step sets
// {0,0,0}, {1,0,0}, {1,1,1} and {0,1,0} (ping_pong, intra_warpgroup_overlap, persistent).
void fa3_forward_steps(const Problem& problem, const ForwardArgs& args, const Fa3Steps& steps);

// Generation 3 backward (kernels/03_fa3_sm90/backward_*): FA2 Algorithm 2 with FA3's structure: a
// TMA producer warp, a dQ writer warp adding dQ by bulk reductions, two consumer warpgroups on
// wgmma with S and dP transposed and dK, dV in registers. bf16 and fp16, head_dim multiples of 8
// up to 128 (instances for 64 and 128), causal (both alignments), sliding windows, GQA/MQA (dK,
// dV of a group summed in registers), varlen, the deterministic mode. Compute capability exactly
// 9.0 and a build with sm_90a code. Workspace: fa3_backward_workspace_bytes.
void fa3_backward(const Problem& problem, const BackwardArgs& args);
std::size_t fa3_backward_workspace_bytes(const Problem& problem, bool deterministic);

// Rung 4 (kernels/04_decode_sm80/): decoding against a KV cache (Flash-Decoding): one to 16 query
// tokens per sequence against its cached keys, the query heads of a KV head packed into one tile,
// the keys split into chunks across the GPU and the chunks' partial O and LSE combined by
// log-sum-exp in the same kernel; a contiguous or a paged cache (block table); the new tokens'
// K and V appended at cache_seqlens first (flash-attn's flash_attn_with_kvcache). The problem
// gives dtype (bf16, fp16), batch, heads_q, heads_kv, head_dim (multiples of 8 up to 256),
// softmax_scale, seqlen_q (query tokens, 1..16), causal (bottom-right: query token i sees keys
// j <= i + keys - seqlen_q of its sequence) and seqlen_k: the cache's capacity per sequence
// (contiguous: its positions; paged: max_pages_per_sequence * page_size). Compute capability >= 8.0.
struct DecodeArgs {
  DeviceTensor q, o;  // (batch, query token, query head)
  DeviceTensor lse;   // fp32, natural log, (batch, query token, query head)
  // The cache: contiguous, (batch, position, KV head) with problem.seqlen_k positions; or paged,
  // (page, slot, KV head) with num_pages pages of page_size slots and a block table of page ids.
  DeviceTensor k_cache, v_cache;
  const int* block_table = nullptr;  // device, [batch][max_pages_per_sequence]; nullptr: contiguous
  int max_pages_per_sequence = 0;
  int num_pages = 0, page_size = 0;
  const int* cache_seqlens = nullptr;  // device, batch ints: keys in the cache before the append
  // The new tokens (seqlen_new of them per sequence, (batch, token, KV head)), written into the
  // cache at cache_seqlens[b] .. + seqlen_new - 1 and attended to; seqlen_new = 0: none.
  DeviceTensor k_new, v_new;
  int seqlen_new = 0;
  // Host copies of cache_seqlens and of the block table, read before any launch: every length
  // within the cache and every page id that a length reaches within [0, num_pages), or the call
  // is refused by name; the longest sequence also sizes the split. nullptr: not checked (the
  // caller vouches for them; a page id out of range reads memory that is not the cache).
  const int* host_cache_seqlens = nullptr;
  const int* host_block_table = nullptr;
  int num_splits = 0;  // chunks per sequence; 0: the fewest that fill the device best
  // Scratch for the chunks' partial O and LSE (decode_workspace_bytes; 0 when one chunk does),
  // whose first bytes are counters that must be zero on entry (they are zero again on return:
  // zero a workspace once). nullptr: allocated and zeroed stream-ordered by the call.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};
void decode_attention(const Problem& problem, const DecodeArgs& args);
// The workspace and the chunks per sequence a call with these arguments (q, o, lse and the
// workspace not needed) takes on the current device.
std::size_t decode_workspace_bytes(const Problem& problem, const DecodeArgs& args);
int decode_splits(const Problem& problem, const DecodeArgs& args);
// The decode kernel's loads alone (same grid, same K and V bytes, no arithmetic, no output, no
// append): the ceiling for a decode kernel of this shape on this device.
void decode_stream_read(const Problem& problem, const DecodeArgs& args);

// ---------------------------------------------------------------------------------------------
// Checks shared by the rungs (kernels/attention_api.cpp). Each throws std::invalid_argument
// naming the input and the allowed range. Every rung runs the checks that need no device first
// (the problem, the tensors, the grid) and the device's last, so a call refused for its
// arguments makes no CUDA call at all (tests/abi/ holds the refusals to that on a machine
// without a GPU).

// problem.validate() plus the features no kernel implements yet: ALiBi, softcap, block sparsity,
// dropout, head_dim_v != head_dim, fp32 tensors.
void require_kernel_supported(const Problem& problem, const char* kernel_name);
// The current device's compute capability is at least major.minor.
void require_compute_capability(int major, int minor, const char* kernel_name);
// The current device's compute capability is exactly major.minor (sm_90a code runs on 9.0 only).
void require_compute_capability_exactly(int major, int minor, const char* kernel_name);
// The shared memory one block may opt into on the current device, in bytes.
int max_shared_bytes_per_block();
// Non-null data, alignment to `alignment_bytes`, strides multiples of `stride_multiple` elements.
void require_tensor(const DeviceTensor& tensor, const char* tensor_name, const char* kernel_name,
                    std::size_t alignment_bytes, int stride_multiple);

// One tensor argument of a call with the extents the call addresses (varlen: one batch of packed
// rows). Outputs are written, so they must not share memory with any other argument.
struct TensorArgument {
  const char* name;
  DeviceTensor tensor;
  std::int64_t batches, rows, heads, columns;
  int element_bytes;
  bool output;
};
// The layouts and their aliasing: a positive stride wherever an extent exceeds 1; the highest
// byte offset within int64 and the address space; outputs with no two elements at one address;
// no output overlapping another argument (address ranges that meet are refused unless both have
// the same strides and extents and no element meets, as in a packed qkv or dqkv buffer).
void require_tensor_arguments(const TensorArgument* arguments, std::size_t count, const char* kernel_name);
// The tensors every forward kernel reads and writes: require_tensor on q, k, v and o (with
// `alignment_bytes` and `stride_multiple`) and on lse (4 bytes, 1), their layouts and aliasing
// (require_tensor_arguments), and the device cu_seqlens arrays of a varlen problem.
void require_forward_args(const Problem& problem, const ForwardArgs& args, const char* kernel_name,
                          std::size_t alignment_bytes, int stride_multiple);
// The same for the backward's q, k, v, o, d_o (read), dq, dk, dv (written) and lse.
void require_backward_args(const Problem& problem, const BackwardArgs& args, const char* kernel_name,
                           std::size_t alignment_bytes, int stride_multiple);
// Device copies of the cu_seqlens arrays when the problem is varlen.
void require_varlen_offsets(const Problem& problem, const int* cu_seqlens_q, const int* cu_seqlens_k,
                            const char* kernel_name);
// A launch grid within CUDA's limits (x < 2^31, y and z <= 65535); each dimension is named by
// what it counts ("batch", "heads_q", "query blocks"), so a refusal names the input that set it.
struct GridDimension {
  std::int64_t blocks;
  const char* counts;
};
void require_grid(const char* kernel_name, GridDimension x, GridDimension y, GridDimension z);
// The blocks of a launch counted in one int (the FA3 rung's tile orders index them so): x * y * z,
// refused past INT_MAX naming the product by `counts` ("batch x heads_q x query blocks").
int require_int_blocks(const char* kernel_name, const char* counts, std::int64_t x, std::int64_t y, std::int64_t z);
// Throws std::runtime_error naming the kernel if a CUDA call failed (cudaGetLastError after launch).
void check_cuda(cudaError_t status, const char* what);
// The current device's streaming multiprocessors (a persistent grid's size), through check_cuda.
int current_device_sm_count();

}  // namespace flashlab::kernels
