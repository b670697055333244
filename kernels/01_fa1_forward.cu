// FA1-generation forward (FlashAttention, Dao et al. 2022, Algorithm 1), fp16, head dims up to
// 128, compute capability 7.5 and newer.
//
// The structure is the paper's: one thread block per (batch, head); the K/V blocks are the outer
// loop (line 5) and the Q blocks the inner loop (line 7); the output O and the softmax statistics
// l and m live in HBM (fp32 workspace) and are read and re-written for every (Q block, K/V block)
// pair (lines 8 and 12-13). Only the last K/V block a Q block sees writes the final O (fp16) and
// LSE. Tensor cores through mma.sync (m16n8k16 on sm_80+, two m16n8k8 on sm_75), fragments
// through ldmatrix, plain loads (no cp.async: Turing has none). Each warp owns 16 query rows of
// a 64-row Q block; K/V blocks are 64 keys. Causal and window masks skip whole empty blocks.
//
// What this costs against the FA2 generation is the point of keeping it: only batch * heads
// blocks (a few per SM at long sequences), O/l/m traffic to HBM once per K/V block, and no
// overlap of loads with math. docs/kernels.md measures it.
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/attention_api.hpp"
#include "kernels/kernel_common.cuh"

namespace flashlab::kernels {

namespace {

constexpr const char* kName = "fa1_forward";
constexpr int kFa1BlockM = 64, kFa1BlockN = 64, kFa1Warps = 4;

struct Fa1ForwardParams {
  const __half* q;
  const __half* k;
  const __half* v;
  __half* o;
  float* lse;
  std::int64_t q_batch_stride, q_row_stride, q_head_stride;
  std::int64_t k_batch_stride, k_row_stride, k_head_stride;
  std::int64_t v_batch_stride, v_row_stride, v_head_stride;
  std::int64_t o_batch_stride, o_row_stride, o_head_stride;
  std::int64_t lse_batch_stride, lse_row_stride, lse_head_stride;
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int seqlen_q, seqlen_k, heads_q, group_size, head_dim;
  float scale_log2;
  int bottom_right, window_left, window_right;
  int vector_loads;  // 16-byte loads allowed (head_dim, strides multiples of 8, aligned pointers)
  float* o_state;    // HBM state of Algorithm 1: O [rows_q, heads_q, head_dim], m and l [rows_q, heads_q]
  float* m_state;
  float* l_state;
};

// rows x kHeadDim of one head into a padded shared tile, zero-filled past rows_valid / head_dim.
// `first_thread` / `thread_count` pick the threads that share the copy (a warp or the block).
template <int kHeadDim, int kStride>
__device__ void load_rows(__half* shared, const __half* global, std::int64_t row_stride, int rows, int rows_valid,
                          int head_dim, bool vector_loads, int thread_index, int thread_count) {
  if (vector_loads) {
    constexpr int kChunksPerRow = kHeadDim / 8;
    for (int chunk = thread_index; chunk < rows * kChunksPerRow; chunk += thread_count) {
      const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
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
__global__ void __launch_bounds__(kFa1Warps * 32) fa1_forward_kernel(const Fa1ForwardParams p) {
  using namespace device;
  constexpr int kBlockM = kFa1BlockM, kBlockN = kFa1BlockN, kStride = kHeadDim + 8, kThreads = kFa1Warps * 32;
  constexpr int kKSteps = kHeadDim / 16, kNTiles = kBlockN / 8, kDTiles = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  __half* q_shared = reinterpret_cast<__half*>(shared_bytes);
  __half* k_shared = q_shared + kBlockM * kStride;
  __half* v_shared = k_shared + kBlockN * kStride;

  const int head = blockIdx.x, batch = blockIdx.y, kv_head = head / p.group_size;
  int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
  std::int64_t q_base = batch * p.q_batch_stride, k_base = batch * p.k_batch_stride;
  std::int64_t v_base = batch * p.v_batch_stride, o_base = batch * p.o_batch_stride;
  std::int64_t lse_base = batch * p.lse_batch_stride;
  int first_row_q = batch * p.seqlen_q;  // packed row of the state tensors
  if (p.cu_seqlens_q != nullptr) {
    const int first_q = p.cu_seqlens_q[batch], first_k = p.cu_seqlens_k[batch];
    seqlen_q = p.cu_seqlens_q[batch + 1] - first_q;
    seqlen_k = p.cu_seqlens_k[batch + 1] - first_k;
    q_base = first_q * p.q_row_stride, o_base = first_q * p.o_row_stride, lse_base = first_q * p.lse_row_stride;
    k_base = first_k * p.k_row_stride, v_base = first_k * p.v_row_stride;
    first_row_q = first_q;
  }
  const __half* q = p.q + q_base + head * p.q_head_stride;
  const __half* k = p.k + k_base + kv_head * p.k_head_stride;
  const __half* v = p.v + v_base + kv_head * p.v_head_stride;
  __half* o = p.o + o_base + head * p.o_head_stride;
  float* lse = p.lse + lse_base + head * p.lse_head_stride;
  auto state_index = [&](int row) { return static_cast<std::int64_t>(first_row_q + row) * p.heads_q + head; };

  const MaskRule mask{p.bottom_right ? seqlen_k - seqlen_q : 0, p.window_left, p.window_right, seqlen_k};
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
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
    load_rows<kHeadDim, kStride>(k_shared, k + key0 * p.k_row_stride, p.k_row_stride, kBlockN, seqlen_k - key0,
                                 p.head_dim, p.vector_loads, threadIdx.x, kThreads);
    load_rows<kHeadDim, kStride>(v_shared, v + key0 * p.v_row_stride, p.v_row_stride, kBlockN, seqlen_k - key0,
                                 p.head_dim, p.vector_loads, threadIdx.x, kThreads);
    __syncthreads();

    // Line 7: the inner loop over Q blocks.
    for (int m_block = 0; m_block < m_blocks; ++m_block) {
      const int row_begin = m_block * kBlockM, row_last = min(row_begin + kBlockM, seqlen_q) - 1;
      const int first = mask.first_key(row_begin), last = mask.last_key(row_last);
      if (last <= first || key0 >= last || key0 + kBlockN <= first) continue;  // an empty block: skipped
      const bool last_block_of_row_block = n_block == (last - 1) / kBlockN;
      const int warp_row0 = warp * 16;

      // Line 8: Q_i (this warp's 16 rows) into SRAM; O_i, l_i, m_i are read below, per thread.
      __syncwarp();
      load_rows<kHeadDim, kStride>(q_shared + warp_row0 * kStride, q + (row_begin + warp_row0) * p.q_row_stride,
                                   p.q_row_stride, 16, seqlen_q - row_begin - warp_row0, p.head_dim, p.vector_loads,
                                   lane, 32);
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
        block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
        block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 2));
        block_max *= p.scale_log2;
        const float subtract = block_max == -INFINITY ? 0.f : block_max;
        float block_sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          acc_s[nt][2 * r] = exp2f(fmaf(acc_s[nt][2 * r], p.scale_log2, -subtract));
          acc_s[nt][2 * r + 1] = exp2f(fmaf(acc_s[nt][2 * r + 1], p.scale_log2, -subtract));
          block_sum += acc_s[nt][2 * r] + acc_s[nt][2 * r + 1];
        }
        block_sum += __shfl_xor_sync(0xffffffffu, block_sum, 1);
        block_sum += __shfl_xor_sync(0xffffffffu, block_sum, 2);
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
              o[row * p.o_row_stride + col] = __float2half_rn(value);
            } else {
              o_state[col] = value;
            }
          }
        }
        if (t == 0) {
          if (last_block_of_row_block) {
            lse[row * p.lse_row_stride] =
                l_new[r] > 0.f ? (m_new[r] + __log2f(l_new[r])) * 0.6931471805599453f : -INFINITY;
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
      o[row * p.o_row_stride + col] = __float2half_rn(0.f);
      if (col == 0) lse[row * p.lse_row_stride] = -INFINITY;
    }
  }
}

template <int kHeadDim>
void launch(const Fa1ForwardParams& params, int batch, int heads, cudaStream_t stream) {
  const int shared_bytes = (kFa1BlockM + 2 * kFa1BlockN) * (kHeadDim + 8) * static_cast<int>(sizeof(__half));
  auto* kernel = &fa1_forward_kernel<kHeadDim>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes),
             "fa1_forward: cudaFuncSetAttribute(shared memory)");
  kernel<<<dim3(heads, batch), kFa1Warps * 32, shared_bytes, stream>>>(params);
  check_cuda(cudaGetLastError(), "fa1_forward kernel launch");
}

bool aligned16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

}  // namespace

std::size_t fa1_forward_workspace_bytes(const Problem& problem) {
  const std::size_t rows = static_cast<std::size_t>(problem.total_rows_q()) * problem.heads_q;
  return rows * (static_cast<std::size_t>(problem.head_dim) + 2) * sizeof(float);
}

void fa1_forward(const Problem& problem, const ForwardArgs& args) {
  require_kernel_supported(problem, kName);
  if (problem.dtype != DType::fp16) {
    throw std::invalid_argument(std::string(kName) + ": dtype " + to_string(problem.dtype) + " is not supported; allowed: fp16");
  }
  if (problem.head_dim > 128) {
    throw std::invalid_argument(std::string(kName) + ": head_dim = " + std::to_string(problem.head_dim) +
                                " is not supported; allowed: [1, 128]");
  }
  require_compute_capability(7, 5, kName);
  require_forward_args(problem, args, kName, 2, 1);
  const std::size_t workspace_bytes = fa1_forward_workspace_bytes(problem);
  if (args.workspace != nullptr && args.workspace_bytes < workspace_bytes) {
    throw std::invalid_argument(std::string(kName) + ": workspace_bytes = " + std::to_string(args.workspace_bytes) +
                                "; allowed: >= fa1_forward_workspace_bytes() = " + std::to_string(workspace_bytes));
  }

  Fa1ForwardParams params{};
  params.q = static_cast<const __half*>(args.q.data), params.k = static_cast<const __half*>(args.k.data);
  params.v = static_cast<const __half*>(args.v.data), params.o = static_cast<__half*>(args.o.data);
  params.lse = static_cast<float*>(args.lse.data);
  params.q_batch_stride = args.q.batch_stride, params.q_row_stride = args.q.row_stride, params.q_head_stride = args.q.head_stride;
  params.k_batch_stride = args.k.batch_stride, params.k_row_stride = args.k.row_stride, params.k_head_stride = args.k.head_stride;
  params.v_batch_stride = args.v.batch_stride, params.v_row_stride = args.v.row_stride, params.v_head_stride = args.v.head_stride;
  params.o_batch_stride = args.o.batch_stride, params.o_row_stride = args.o.row_stride, params.o_head_stride = args.o.head_stride;
  params.lse_batch_stride = args.lse.batch_stride, params.lse_row_stride = args.lse.row_stride;
  params.lse_head_stride = args.lse.head_stride;
  params.cu_seqlens_q = problem.varlen() ? args.cu_seqlens_q : nullptr;
  params.cu_seqlens_k = problem.varlen() ? args.cu_seqlens_k : nullptr;
  params.seqlen_q = problem.seqlen_q, params.seqlen_k = problem.seqlen_k;
  params.heads_q = problem.heads_q, params.group_size = problem.group_size(), params.head_dim = problem.head_dim;
  params.scale_log2 = static_cast<float>(problem.scale() * M_LOG2E);
  params.bottom_right = problem.mask.alignment == CausalAlignment::bottom_right ? 1 : 0;
  params.window_left = problem.mask.window_left;
  params.window_right = problem.mask.effective_window_right();
  bool vector_loads = problem.head_dim % 8 == 0;
  for (const DeviceTensor* tensor : {&args.q, &args.k, &args.v}) {
    vector_loads = vector_loads && aligned16(tensor->data) && tensor->row_stride % 8 == 0 &&
                   tensor->head_stride % 8 == 0 && tensor->batch_stride % 8 == 0;
  }
  params.vector_loads = vector_loads ? 1 : 0;

  void* workspace = args.workspace;
  if (workspace == nullptr) check_cuda(cudaMallocAsync(&workspace, workspace_bytes, args.stream), "fa1_forward: cudaMallocAsync");
  const std::size_t rows = static_cast<std::size_t>(problem.total_rows_q()) * problem.heads_q;
  params.o_state = static_cast<float*>(workspace);
  params.m_state = params.o_state + rows * problem.head_dim;
  params.l_state = params.m_state + rows;

  if (problem.head_dim <= 64) {
    launch<64>(params, problem.batch, problem.heads_q, args.stream);
  } else {
    launch<128>(params, problem.batch, problem.heads_q, args.stream);
  }
  if (args.workspace == nullptr) check_cuda(cudaFreeAsync(workspace, args.stream), "fa1_forward: cudaFreeAsync");
}

}  // namespace flashlab::kernels
