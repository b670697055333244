// A thin C ABI over the host API, for Python's ctypes (scripts/bench_kernels.py) or any other
// language. Tensors are passed as device pointers with (batch, row, head) strides in elements, so
// a PyTorch tensor of any layout with a contiguous last dim goes in as it is. Every entry returns
// 0 on success, 2 when the input is refused (the message names it), 1 on a CUDA or other error;
// flashlab_last_error() gives the message. Exceptions never cross the ABI.
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/03_fa3_sm90/gemm.hpp"
#include "kernels/attention_api.hpp"

namespace {

thread_local std::string last_error;

using flashlab::kernels::DeviceTensor;

DeviceTensor tensor(void* data, const std::int64_t* strides) {
  DeviceTensor t;
  t.data = data;
  if (strides != nullptr) t.batch_stride = strides[0], t.row_stride = strides[1], t.head_stride = strides[2];
  return t;
}

template <class Body>
int guarded(Body&& body) {
  try {
    body();
    last_error.clear();
    return 0;
  } catch (const std::invalid_argument& error) {
    last_error = error.what();
    return 2;
  } catch (const std::exception& error) {
    last_error = error.what();
    return 1;
  }
}

}  // namespace

extern "C" {

// The problem, as plain integers: dtype 1 = fp16, 2 = bf16; causal 0/1; alignment 0 = top-left,
// 1 = bottom-right; window bounds -1 = unbounded; softmax_scale 0 = 1/sqrt(head_dim).
// cu_seqlens_*_host: batch + 1 ints on the host (null unless varlen); *_device: the same on the
// device.
struct FlashlabProblem {
  int dtype;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  double softmax_scale;
  int causal, alignment, window_left, window_right;
  const int* cu_seqlens_q_host;
  const int* cu_seqlens_k_host;
  const int* cu_seqlens_q_device;
  const int* cu_seqlens_k_device;
};

const char* flashlab_last_error() { return last_error.c_str(); }

}  // extern "C"

namespace {

flashlab::Problem to_problem(const FlashlabProblem& p) {
  flashlab::Problem problem;
  if (p.dtype != 1 && p.dtype != 2) {
    throw std::invalid_argument("dtype code " + std::to_string(p.dtype) + "; allowed: 1 (fp16), 2 (bf16)");
  }
  problem.dtype = p.dtype == 1 ? flashlab::DType::fp16 : flashlab::DType::bf16;
  problem.batch = p.batch, problem.heads_q = p.heads_q, problem.heads_kv = p.heads_kv;
  problem.seqlen_q = p.seqlen_q, problem.seqlen_k = p.seqlen_k, problem.head_dim = p.head_dim;
  problem.softmax_scale = p.softmax_scale;
  problem.mask.causal = p.causal != 0;
  problem.mask.alignment = p.alignment == 0 ? flashlab::CausalAlignment::top_left : flashlab::CausalAlignment::bottom_right;
  problem.mask.window_left = p.window_left, problem.mask.window_right = p.window_right;
  if (p.cu_seqlens_q_host != nullptr) {
    problem.cu_seqlens_q.assign(p.cu_seqlens_q_host, p.cu_seqlens_q_host + p.batch + 1);
    problem.cu_seqlens_k.assign(p.cu_seqlens_k_host, p.cu_seqlens_k_host + p.batch + 1);
  }
  return problem;
}

flashlab::kernels::ForwardArgs forward_args(const FlashlabProblem& problem, void* q, const std::int64_t* q_strides,
                                             void* k, const std::int64_t* k_strides, void* v,
                                             const std::int64_t* v_strides, void* o, const std::int64_t* o_strides,
                                             float* lse, const std::int64_t* lse_strides, void* stream) {
  flashlab::kernels::ForwardArgs args;
  args.q = tensor(q, q_strides), args.k = tensor(k, k_strides), args.v = tensor(v, v_strides);
  args.o = tensor(o, o_strides), args.lse = tensor(lse, lse_strides);
  args.cu_seqlens_q = problem.cu_seqlens_q_device, args.cu_seqlens_k = problem.cu_seqlens_k_device;
  args.stream = static_cast<cudaStream_t>(stream);
  return args;
}

}  // namespace

extern "C" {

// generation: 1 = FA1 forward, 2 = FA2 forward, 3 = FA3 forward (Hopper).
int flashlab_forward(int generation, const FlashlabProblem* problem, void* q, const std::int64_t* q_strides, void* k,
                     const std::int64_t* k_strides, void* v, const std::int64_t* v_strides, void* o,
                     const std::int64_t* o_strides, float* lse, const std::int64_t* lse_strides, void* stream) {
  return guarded([&] {
    const flashlab::Problem p = to_problem(*problem);
    const auto args = forward_args(*problem, q, q_strides, k, k_strides, v, v_strides, o, o_strides, lse, lse_strides, stream);
    if (generation == 1) {
      flashlab::kernels::fa1_forward(p, args);
    } else if (generation == 2) {
      flashlab::kernels::fa2_forward(p, args);
    } else if (generation == 3) {
      flashlab::kernels::fa3_forward(p, args);
    } else {
      throw std::invalid_argument("generation = " + std::to_string(generation) + "; allowed: 1 (FA1), 2 (FA2), 3 (FA3)");
    }
  });
}

// The FA3 forward with some of its steps off (each flag 0 or 1), for the ablation.
int flashlab_fa3_forward_steps(int ping_pong, int intra_warpgroup_overlap, int persistent,
                               const FlashlabProblem* problem, void* q, const std::int64_t* q_strides, void* k,
                               const std::int64_t* k_strides, void* v, const std::int64_t* v_strides, void* o,
                               const std::int64_t* o_strides, float* lse, const std::int64_t* lse_strides, void* stream) {
  return guarded([&] {
    const flashlab::Problem p = to_problem(*problem);
    const auto args = forward_args(*problem, q, q_strides, k, k_strides, v, v_strides, o, o_strides, lse, lse_strides, stream);
    flashlab::kernels::fa3_forward_steps(p, args, {ping_pong != 0, intra_warpgroup_overlap != 0, persistent != 0});
  });
}

// The Hopper rung's GEMM: C [m, n] = A [m, k] B [n, k]^T, bf16, contiguous row-major.
int flashlab_sm90_gemm_bf16(const void* a, const void* b, void* c, int m, int n, int k, void* stream) {
  return guarded([&] { flashlab::kernels::sm90_gemm_bf16(a, b, c, m, n, k, static_cast<cudaStream_t>(stream)); });
}

// FA2 backward: dQ, dK, dV from Q, K, V, O, LSE and dO (workspace allocated by the call).
int flashlab_backward(const FlashlabProblem* problem, int deterministic, void* q, const std::int64_t* q_strides, void* k,
                      const std::int64_t* k_strides, void* v, const std::int64_t* v_strides, void* o,
                      const std::int64_t* o_strides, float* lse, const std::int64_t* lse_strides, void* d_o,
                      const std::int64_t* d_o_strides, void* dq, const std::int64_t* dq_strides, void* dk,
                      const std::int64_t* dk_strides, void* dv, const std::int64_t* dv_strides, void* stream) {
  return guarded([&] {
    const flashlab::Problem p = to_problem(*problem);
    flashlab::kernels::BackwardArgs args;
    args.q = tensor(q, q_strides), args.k = tensor(k, k_strides), args.v = tensor(v, v_strides);
    args.o = tensor(o, o_strides), args.lse = tensor(lse, lse_strides), args.d_o = tensor(d_o, d_o_strides);
    args.dq = tensor(dq, dq_strides), args.dk = tensor(dk, dk_strides), args.dv = tensor(dv, dv_strides);
    args.cu_seqlens_q = problem->cu_seqlens_q_device, args.cu_seqlens_k = problem->cu_seqlens_k_device;
    args.deterministic = deterministic != 0;
    args.stream = static_cast<cudaStream_t>(stream);
    flashlab::kernels::fa2_backward(p, args);
  });
}

}  // extern "C"
