// The C ABI (kernels/include/flashlab.h, whose comment is the contract) over the host API. Tensors are
// passed as device pointers with (batch, row, head) strides in elements, so a PyTorch tensor of
// any layout with a contiguous last dim goes in as it is. What the ABI adds to the host API's
// checks is what only the ABI can get wrong: null pointers, enum codes that are not codes, the
// varlen arrays' pairing and length. Every check runs before any CUDA call.
#include "flashlab.h"

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

[[noreturn]] void refuse(const char* entry, const std::string& message) {
  throw std::invalid_argument(std::string(entry) + ": " + message);
}

void require_code(const char* entry, const char* name, int value, int low, int high, const char* meaning) {
  if (value < low || value > high) {
    refuse(entry, std::string(name) + " = " + std::to_string(value) + "; allowed: " + meaning);
  }
}

DeviceTensor tensor(const char* entry, const char* name, void* data, const std::int64_t* strides) {
  if (strides == nullptr) {
    refuse(entry, std::string(name) + "_strides is null; allowed: three strides in elements (batch, row, head)");
  }
  DeviceTensor t;
  t.data = data;
  t.batch_stride = strides[0], t.row_stride = strides[1], t.head_stride = strides[2];
  return t;
}

// Both of a pair of varlen arrays given or neither.
void require_pair(const char* entry, const char* q_name, const void* q, const char* k_name, const void* k) {
  if ((q == nullptr) != (k == nullptr)) {
    refuse(entry, std::string(q == nullptr ? q_name : k_name) + " is null while " + (q == nullptr ? k_name : q_name) +
                      " is set; allowed: both (a varlen batch) or neither (a dense one)");
  }
}

flashlab::Problem to_problem(const char* entry, const FlashlabProblem* p) {
  if (p == nullptr) refuse(entry, "problem is null; allowed: a pointer to a FlashlabProblem");
  require_code(entry, "dtype", p->dtype, 1, 2, "1 (fp16), 2 (bf16)");
  require_code(entry, "causal", p->causal, 0, 1, "0 or 1");
  require_code(entry, "alignment", p->alignment, 0, 1, "0 (top-left), 1 (bottom-right)");
  flashlab::Problem problem;
  problem.dtype = p->dtype == 1 ? flashlab::DType::fp16 : flashlab::DType::bf16;
  problem.batch = p->batch, problem.heads_q = p->heads_q, problem.heads_kv = p->heads_kv;
  problem.seqlen_q = p->seqlen_q, problem.seqlen_k = p->seqlen_k, problem.head_dim = p->head_dim;
  problem.softmax_scale = p->softmax_scale;
  problem.mask.causal = p->causal == 1;
  problem.mask.alignment =
      p->alignment == 0 ? flashlab::CausalAlignment::top_left : flashlab::CausalAlignment::bottom_right;
  problem.mask.window_left = p->window_left, problem.mask.window_right = p->window_right;

  require_pair(entry, "cu_seqlens_q_host", p->cu_seqlens_q_host, "cu_seqlens_k_host", p->cu_seqlens_k_host);
  require_pair(entry, "cu_seqlens_q_device", p->cu_seqlens_q_device, "cu_seqlens_k_device", p->cu_seqlens_k_device);
  if ((p->cu_seqlens_q_host == nullptr) != (p->cu_seqlens_q_device == nullptr)) {
    refuse(entry, std::string("varlen offsets given ") + (p->cu_seqlens_q_host == nullptr ? "on the device only" : "on the host only") +
                      "; allowed: host and device offsets together (a varlen batch) or neither (a dense one)");
  }
  if (p->cu_seqlens_q_host != nullptr) {
    // The batch first (as validate checks it, on a problem of that batch alone): batch + 1
    // entries are read only once that count is known to be sane.
    flashlab::Problem batch_only;
    batch_only.batch = p->batch;
    batch_only.validate();
    problem.cu_seqlens_q.assign(p->cu_seqlens_q_host, p->cu_seqlens_q_host + p->batch + 1);
    problem.cu_seqlens_k.assign(p->cu_seqlens_k_host, p->cu_seqlens_k_host + p->batch + 1);
  }
  problem.validate();
  return problem;
}

flashlab::kernels::ForwardArgs forward_args(const char* entry, const FlashlabProblem& problem, void* q,
                                             const std::int64_t* q_strides, void* k, const std::int64_t* k_strides,
                                             void* v, const std::int64_t* v_strides, void* o,
                                             const std::int64_t* o_strides, float* lse,
                                             const std::int64_t* lse_strides, void* stream) {
  flashlab::kernels::ForwardArgs args;
  args.q = tensor(entry, "q", q, q_strides), args.k = tensor(entry, "k", k, k_strides);
  args.v = tensor(entry, "v", v, v_strides), args.o = tensor(entry, "o", o, o_strides);
  args.lse = tensor(entry, "lse", lse, lse_strides);
  args.cu_seqlens_q = problem.cu_seqlens_q_device, args.cu_seqlens_k = problem.cu_seqlens_k_device;
  args.stream = static_cast<cudaStream_t>(stream);
  return args;
}

// The host API's decode arguments from the ABI's cache description; q, o, lse set by the caller.
flashlab::kernels::DecodeArgs decode_args(const char* entry, const FlashlabKvCache* cache, int num_splits) {
  if (cache == nullptr) refuse(entry, "cache is null; allowed: a pointer to a FlashlabKvCache");
  flashlab::kernels::DecodeArgs args;
  args.k_cache = tensor(entry, "k_cache", cache->k_cache, cache->k_cache_strides);
  args.v_cache = tensor(entry, "v_cache", cache->v_cache, cache->v_cache_strides);
  args.block_table = cache->block_table, args.max_pages_per_sequence = cache->max_pages_per_sequence;
  args.num_pages = cache->num_pages, args.page_size = cache->page_size;
  args.cache_seqlens = cache->cache_seqlens, args.seqlen_new = cache->seqlen_new;
  if (cache->seqlen_new != 0) {
    args.k_new = tensor(entry, "k_new", cache->k_new, cache->k_new_strides);
    args.v_new = tensor(entry, "v_new", cache->v_new, cache->v_new_strides);
  } else if (cache->k_new != nullptr || cache->v_new != nullptr) {
    refuse(entry, "k_new or v_new is set with seqlen_new = 0; allowed: null when no token is appended");
  }
  args.host_cache_seqlens = cache->host_cache_seqlens, args.host_block_table = cache->host_block_table;
  args.num_splits = num_splits;
  return args;
}

template <class Body>
int guarded(Body&& body) {
  try {
    body();
    last_error.clear();
    return FLASHLAB_OK;
  } catch (const std::invalid_argument& error) {
    last_error = error.what();
    return FLASHLAB_REFUSED;
  } catch (const std::exception& error) {
    last_error = error.what();
    return FLASHLAB_ERROR;
  } catch (...) {
    last_error = "an unknown exception";
    return FLASHLAB_ERROR;
  }
}

}  // namespace

extern "C" {

int flashlab_abi_version() { return FLASHLAB_ABI_VERSION; }

const char* flashlab_last_error() { return last_error.c_str(); }

int flashlab_generation_built(int generation) {
  int built = -1;
  guarded([&] {
    require_code("flashlab_generation_built", "generation", generation, 1, 3, "1 (FA1), 2 (FA2), 3 (FA3)");
#ifdef FLASHLAB_HAVE_SM90A
    built = 1;
#else
    built = generation == 3 ? 0 : 1;
#endif
  });
  return built;
}

int flashlab_forward(int generation, const FlashlabProblem* problem, void* q, const std::int64_t* q_strides, void* k,
                     const std::int64_t* k_strides, void* v, const std::int64_t* v_strides, void* o,
                     const std::int64_t* o_strides, float* lse, const std::int64_t* lse_strides, void* stream) {
  return guarded([&] {
    constexpr const char* kEntry = "flashlab_forward";
    require_code(kEntry, "generation", generation, 1, 3, "1 (FA1), 2 (FA2), 3 (FA3)");
    const flashlab::Problem p = to_problem(kEntry, problem);
    const auto args =
        forward_args(kEntry, *problem, q, q_strides, k, k_strides, v, v_strides, o, o_strides, lse, lse_strides, stream);
    if (generation == 1) {
      flashlab::kernels::fa1_forward(p, args);
    } else if (generation == 2) {
      flashlab::kernels::fa2_forward(p, args);
    } else {
      flashlab::kernels::fa3_forward(p, args);
    }
  });
}

int flashlab_fa3_forward_steps(int ping_pong, int intra_warpgroup_overlap, int persistent,
                               const FlashlabProblem* problem, void* q, const std::int64_t* q_strides, void* k,
                               const std::int64_t* k_strides, void* v, const std::int64_t* v_strides, void* o,
                               const std::int64_t* o_strides, float* lse, const std::int64_t* lse_strides, void* stream) {
  return guarded([&] {
    constexpr const char* kEntry = "flashlab_fa3_forward_steps";
    require_code(kEntry, "ping_pong", ping_pong, 0, 1, "0 or 1");
    require_code(kEntry, "intra_warpgroup_overlap", intra_warpgroup_overlap, 0, 1, "0 or 1");
    require_code(kEntry, "persistent", persistent, 0, 1, "0 or 1");
    const flashlab::Problem p = to_problem(kEntry, problem);
    const auto args =
        forward_args(kEntry, *problem, q, q_strides, k, k_strides, v, v_strides, o, o_strides, lse, lse_strides, stream);
    flashlab::kernels::fa3_forward_steps(p, args, {ping_pong == 1, intra_warpgroup_overlap == 1, persistent == 1});
  });
}

int flashlab_sm90_gemm_bf16(const void* a, const void* b, void* c, int m, int n, int k, void* stream) {
  return guarded([&] { flashlab::kernels::sm90_gemm_bf16(a, b, c, m, n, k, static_cast<cudaStream_t>(stream)); });
}

int flashlab_backward(int generation, const FlashlabProblem* problem, int deterministic, void* q, const std::int64_t* q_strides, void* k,
                      const std::int64_t* k_strides, void* v, const std::int64_t* v_strides, void* o,
                      const std::int64_t* o_strides, float* lse, const std::int64_t* lse_strides, void* d_o,
                      const std::int64_t* d_o_strides, void* dq, const std::int64_t* dq_strides, void* dk,
                      const std::int64_t* dk_strides, void* dv, const std::int64_t* dv_strides, void* stream) {
  return guarded([&] {
    constexpr const char* kEntry = "flashlab_backward";
    require_code(kEntry, "generation", generation, 2, 3, "2 (FA2), 3 (FA3)");
    require_code(kEntry, "deterministic", deterministic, 0, 1, "0 or 1");
    const flashlab::Problem p = to_problem(kEntry, problem);
    flashlab::kernels::BackwardArgs args;
    args.q = tensor(kEntry, "q", q, q_strides), args.k = tensor(kEntry, "k", k, k_strides);
    args.v = tensor(kEntry, "v", v, v_strides), args.o = tensor(kEntry, "o", o, o_strides);
    args.lse = tensor(kEntry, "lse", lse, lse_strides), args.d_o = tensor(kEntry, "d_o", d_o, d_o_strides);
    args.dq = tensor(kEntry, "dq", dq, dq_strides), args.dk = tensor(kEntry, "dk", dk, dk_strides);
    args.dv = tensor(kEntry, "dv", dv, dv_strides);
    args.cu_seqlens_q = problem->cu_seqlens_q_device, args.cu_seqlens_k = problem->cu_seqlens_k_device;
    args.deterministic = deterministic == 1;
    args.stream = static_cast<cudaStream_t>(stream);
    if (generation == 2) {
      flashlab::kernels::fa2_backward(p, args);
    } else {
      flashlab::kernels::fa3_backward(p, args);
    }
  });
}

int flashlab_decode(const FlashlabProblem* problem, const FlashlabKvCache* cache, int num_splits, void* q,
                    const std::int64_t* q_strides, void* o, const std::int64_t* o_strides, float* lse,
                    const std::int64_t* lse_strides, void* workspace, std::int64_t workspace_bytes, int stream_only,
                    void* stream) {
  return guarded([&] {
    constexpr const char* kEntry = "flashlab_decode";
    require_code(kEntry, "stream_only", stream_only, 0, 1, "0 or 1");
    if (workspace_bytes < 0) refuse(kEntry, "workspace_bytes = " + std::to_string(workspace_bytes) + "; allowed: >= 0");
    const flashlab::Problem p = to_problem(kEntry, problem);
    flashlab::kernels::DecodeArgs args = decode_args(kEntry, cache, num_splits);
    args.q = tensor(kEntry, "q", q, q_strides), args.o = tensor(kEntry, "o", o, o_strides);
    args.lse = tensor(kEntry, "lse", lse, lse_strides);
    args.workspace = workspace, args.workspace_bytes = static_cast<std::size_t>(workspace_bytes);
    args.stream = static_cast<cudaStream_t>(stream);
    if (stream_only == 1) {
      flashlab::kernels::decode_stream_read(p, args);
    } else {
      flashlab::kernels::decode_attention(p, args);
    }
  });
}

int flashlab_decode_workspace_bytes(const FlashlabProblem* problem, const FlashlabKvCache* cache, int num_splits,
                                    std::int64_t* bytes) {
  return guarded([&] {
    constexpr const char* kEntry = "flashlab_decode_workspace_bytes";
    if (bytes == nullptr) refuse(kEntry, "bytes is null; allowed: a pointer to an int64");
    const flashlab::Problem p = to_problem(kEntry, problem);
    *bytes = static_cast<std::int64_t>(flashlab::kernels::decode_workspace_bytes(p, decode_args(kEntry, cache, num_splits)));
  });
}

}  // extern "C"
