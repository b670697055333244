// Timing of the FA2 backward kernel (kernels/02_fa2_sm80/backward_*), or with --generation 3 the
// FA3 backward (kernels/03_fa3_sm90/backward_*), on random bf16 data, in the
// flash-attention FLOP convention (backward = 2.5 x forward = 2.5 x 4 b h s^2 d, halved when
// causal). Medians of CUDA-event timings after a warm-up. Usage:
//   test_fa2_backward_bench [total_tokens=16384] [--deterministic] [--generation 2|3] [--seqlens 512,2048,...]
//                           [--hdims 64,128] [--heads H (default 2048 / head_dim)] [--causal 0,1]
// prints one line per (head_dim, causal, seqlen); --causal 0 or 1 times that mask only. --heads sets
// the grid's size apart from the work per block: e.g. 33 heads give 132 x k blocks of 128 keys
// where 32 give a last wave part full.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/attention_api.hpp"
#include "bench_arguments.hpp"

using namespace flashlab;
using bench::parse_list, bench::parse_one, bench::refuse;

namespace {

void ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

// Approximately standard-normal values from a hash (Irwin-Hall of 4 uniforms), rounded to bf16.
__global__ void fill_normal(__nv_bfloat16* data, std::size_t count, unsigned seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    for (int k = 0; k < 4; ++k) {
      h ^= h >> 16, h *= 0x7feb352du, h ^= h >> 15, h *= 0x846ca68bu, h ^= h >> 16;
      sum += (h & 0xffffff) / 16777216.0f;
    }
    data[i] = __float2bfloat16((sum - 2.0f) * 1.7320508f);
  }
}

__global__ void fill_value(float* data, std::size_t count, float value) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    data[i] = value;
}

// call(), or where the backward refuses the problem (a head dim or shape it does not support, by
// name) that one line on stderr and exit status 2.
template <typename Call>
auto refused_as_input(Call&& call) {
  try {
    return call();
  } catch (const std::invalid_argument& error) {
    std::fprintf(stderr, "%s\n", error.what());
    std::exit(2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int total_tokens = 16384;
  bool deterministic = false;
  int generation = 2;
  std::vector<int> seqlens = {512, 1024, 2048, 4096, 8192, 16384};
  std::vector<int> head_dims = {64, 128};
  std::vector<int> masks = {0, 1};  // causal: 0 without the mask, 1 with it
  int heads = 0;  // 2048 / head_dim
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--deterministic") == 0) {
      deterministic = true;
    } else if (std::strcmp(argv[i], "--generation") == 0 && has_value) {
      if (!parse_one(argv[++i], 2, 3, generation)) return refuse("--generation", argv[i], "2 or 3");
    } else if (std::strcmp(argv[i], "--hdims") == 0 && has_value) {
      if (!parse_list(argv[++i], 1, 256, head_dims)) return refuse("--hdims", argv[i], "1 to 256, comma-separated");
    } else if (std::strcmp(argv[i], "--heads") == 0 && has_value) {
      if (!parse_one(argv[++i], 1, 256, heads)) return refuse("--heads", argv[i], "1 to 256");
    } else if (std::strcmp(argv[i], "--seqlens") == 0 && has_value) {
      if (!parse_list(argv[++i], 1, 1 << 20, seqlens)) {
        return refuse("--seqlens", argv[i], "1 to 1048576, comma-separated");
      }
    } else if (std::strcmp(argv[i], "--causal") == 0 && has_value) {
      if (!parse_list(argv[++i], 0, 1, masks)) return refuse("--causal", argv[i], "0, 1 or 0,1");
    } else if (argv[i][0] == '-') {
      return refuse("option", argv[i],
                    "--deterministic; --generation, --hdims, --heads, --seqlens, --causal with a value");
    } else if (!parse_one(argv[i], 1, 1 << 24, total_tokens)) {
      return refuse("total_tokens", argv[i], "1 to 16777216");
    }
  }
  int count = 0;  // the device after the arguments: a refused one makes no CUDA call
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device\n");
    return 77;
  }
  std::printf("%-5s %-6s %-6s %-5s %-3s %10s %9s\n", "hdim", "causal", "seqlen", "batch", "h", "ms", "TFLOP/s");
  for (int head_dim : head_dims) {
    for (int causal : masks) {
      for (int seqlen : seqlens) {
        Problem problem;
        problem.batch = std::max(1, total_tokens / seqlen);
        problem.heads_q = problem.heads_kv = heads > 0 ? heads : 2048 / head_dim;
        problem.seqlen_q = problem.seqlen_k = seqlen;
        problem.head_dim = head_dim;
        problem.dtype = DType::bf16;
        problem.mask.causal = causal != 0;
        const std::size_t elements = static_cast<std::size_t>(problem.batch) * seqlen * problem.heads_q * head_dim;
        const std::size_t rows = static_cast<std::size_t>(problem.batch) * seqlen * problem.heads_q;
        std::vector<void*> buffers(8);
        for (auto& buffer : buffers) ok(cudaMalloc(&buffer, elements * 2), "cudaMalloc");
        float* lse = nullptr;
        ok(cudaMalloc(&lse, rows * 4), "cudaMalloc");
        for (int i = 0; i < 5; ++i) fill_normal<<<1024, 256>>>(static_cast<__nv_bfloat16*>(buffers[i]), elements, 17u * i + 1);
        // Scores scale * q.k are about N(0, 1): LSE of a row is close to log(keys seen) + 1/2.
        fill_value<<<1024, 256>>>(lse, rows, std::log(causal ? seqlen / 2.0f : static_cast<float>(seqlen)) + 0.5f);
        ok(cudaDeviceSynchronize(), "fill");
        kernels::BackwardArgs args;
        args.q = kernels::flash_layout(buffers[0], problem, problem.heads_q, head_dim, true);
        args.k = kernels::flash_layout(buffers[1], problem, problem.heads_kv, head_dim, false);
        args.v = kernels::flash_layout(buffers[2], problem, problem.heads_kv, head_dim, false);
        args.o = kernels::flash_layout(buffers[3], problem, problem.heads_q, head_dim, true);
        args.d_o = kernels::flash_layout(buffers[4], problem, problem.heads_q, head_dim, true);
        args.dq = kernels::flash_layout(buffers[5], problem, problem.heads_q, head_dim, true);
        args.dk = kernels::flash_layout(buffers[6], problem, problem.heads_kv, head_dim, false);
        args.dv = kernels::flash_layout(buffers[7], problem, problem.heads_kv, head_dim, false);
        args.lse = kernels::flash_layout(lse, problem, problem.heads_q, 1, true);
        args.deterministic = deterministic;
        const auto backward = generation == 3 ? kernels::fa3_backward : kernels::fa2_backward;
        const std::size_t workspace_bytes = refused_as_input([&] {
          return generation == 3 ? kernels::fa3_backward_workspace_bytes(problem, deterministic)
                                 : kernels::fa2_backward_workspace_bytes(problem, deterministic);
        });
        ok(cudaMalloc(&args.workspace, workspace_bytes), "cudaMalloc workspace");
        args.workspace_bytes = workspace_bytes;
        refused_as_input([&] { backward(problem, args); });  // the first warm-up call checks the problem
        for (int i = 0; i < 2; ++i) backward(problem, args);
        ok(cudaDeviceSynchronize(), "warm-up");
        std::vector<float> times;
        cudaEvent_t start, stop;
        cudaEventCreate(&start), cudaEventCreate(&stop);
        for (int i = 0; i < 15; ++i) {
          cudaEventRecord(start);
          backward(problem, args);
          cudaEventRecord(stop);
          ok(cudaEventSynchronize(stop), "timed run");
          float ms = 0;
          cudaEventElapsedTime(&ms, start, stop);
          times.push_back(ms);
        }
        std::sort(times.begin(), times.end());
        const double ms = times[times.size() / 2];
        const double flops = 2.5 * 4.0 * problem.batch * problem.heads_q * double(seqlen) * seqlen * head_dim / (causal ? 2 : 1);
        std::printf("%-5d %-6d %-6d %-5d %-3d %10.3f %9.1f\n", head_dim, causal, seqlen, problem.batch, problem.heads_q, ms,
                    flops / ms / 1e9);
        std::fflush(stdout);
        cudaEventDestroy(start), cudaEventDestroy(stop);
        for (auto& buffer : buffers) cudaFree(buffer);
        cudaFree(lse);
        cudaFree(args.workspace);
      }
    }
  }
  return 0;
}
