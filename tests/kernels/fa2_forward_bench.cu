// One FA2 (or FA1, FA3) forward problem on random bf16/fp16 data, for profilers (ncu,
// compute-sanitizer) and quick timings: runs `repeats` launches and prints the median time and
// TFLOP/s (flash-attention convention: 4 b h s^2 d, halved when causal).
// Usage: fa2_forward_bench batch heads seqlen head_dim causal [repeats=1] [generation=2], each number
// checked against its range (bench_arguments.hpp) before any CUDA call.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <vector>

#include "bench_arguments.hpp"
#include "kernels/attention_api.hpp"

using namespace flashlab;

namespace {
void ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 6 || argc > 8) {
    std::fprintf(stderr, "usage: %s batch heads seqlen head_dim causal [repeats] [generation]\n", argv[0]);
    return 2;
  }
  // Each number in its range before any CUDA call; the forward refuses the rest by name (below).
  int batch = 0, heads = 0, seqlen = 0, head_dim = 0, causal = 0, repeats = 1, generation = 2;
  struct Argument {
    const char* name;
    int low, high;
    int* value;
  };
  const Argument arguments[] = {{"batch", 1, 1 << 16, &batch},    {"heads", 1, 256, &heads},
                                {"seqlen", 1, 1 << 20, &seqlen},  {"head_dim", 1, 256, &head_dim},
                                {"causal", 0, 1, &causal},        {"repeats", 1, 10000, &repeats},
                                {"generation", 1, 3, &generation}};
  for (int i = 1; i < argc; ++i) {
    const Argument& a = arguments[i - 1];
    if (!bench::parse_one(argv[i], a.low, a.high, *a.value)) {
      char allowed[32];
      std::snprintf(allowed, sizeof allowed, "%d to %d", a.low, a.high);
      return bench::refuse(a.name, argv[i], allowed);
    }
  }
  const long long tensor_elements = static_cast<long long>(batch) * heads * seqlen * head_dim;
  if (tensor_elements > (1ll << 31)) {  // each of Q, K, V, O, and a host copy
    std::fprintf(stderr, "batch x heads x seqlen x head_dim = %lld; allowed: up to 2147483648 elements a tensor\n",
                 tensor_elements);
    return 2;
  }
  Problem p;
  p.batch = batch, p.heads_q = p.heads_kv = heads;
  p.seqlen_q = p.seqlen_k = seqlen, p.head_dim = head_dim;
  p.mask.causal = causal != 0;
  p.dtype = generation == 1 ? DType::fp16 : DType::bf16;
  const std::size_t elements = static_cast<std::size_t>(p.batch) * p.seqlen_q * p.heads_q * p.head_dim;
  std::vector<unsigned short> host(elements);
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (auto& x : host) {  // bf16 / fp16 bits of N(0, 1) samples, via float truncation / conversion
    const float value = normal(rng);
    if (p.dtype == DType::bf16) {
      unsigned int bits;
      std::memcpy(&bits, &value, 4);
      x = static_cast<unsigned short>(bits >> 16);
    } else {
      const __half h = __float2half_rn(value);
      std::memcpy(&x, &h, 2);
    }
  }
  void *q, *k, *v, *o, *lse;
  for (void** buffer : {&q, &k, &v, &o}) {
    ok(cudaMalloc(buffer, elements * 2), "cudaMalloc");
    ok(cudaMemcpy(*buffer, host.data(), elements * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ok(cudaMalloc(&lse, elements / p.head_dim * 4), "cudaMalloc");
  kernels::ForwardArgs args;
  args.q = kernels::flash_layout(q, p, p.heads_q, p.head_dim, true);
  args.k = kernels::flash_layout(k, p, p.heads_kv, p.head_dim, false);
  args.v = kernels::flash_layout(v, p, p.heads_kv, p.head_dim, false);
  args.o = kernels::flash_layout(o, p, p.heads_q, p.head_dim, true);
  args.lse = kernels::flash_layout(lse, p, p.heads_q, 1, true);
  cudaEvent_t start, stop;
  ok(cudaEventCreate(&start), "event"), ok(cudaEventCreate(&stop), "event");
  std::vector<float> times;
  try {
    for (int r = 0; r < repeats; ++r) {
      ok(cudaEventRecord(start), "record");
      if (generation == 1) {
        kernels::fa1_forward(p, args);
      } else if (generation == 2) {
        kernels::fa2_forward(p, args);
      } else {
        kernels::fa3_forward(p, args);
      }
      ok(cudaEventRecord(stop), "record");
      ok(cudaEventSynchronize(stop), "sync");
      float ms = 0;
      ok(cudaEventElapsedTime(&ms, start, stop), "elapsed");
      times.push_back(ms);
    }
  } catch (const std::invalid_argument& error) {
    std::fprintf(stderr, "%s\n", error.what());
    return 2;
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  const double flops = 4.0 * p.batch * p.heads_q * double(p.seqlen_q) * p.seqlen_k * p.head_dim / (p.mask.causal ? 2 : 1);
  std::printf("FA%d b=%d h=%d s=%d d=%d causal=%d: %.3f ms, %.1f TFLOP/s\n", generation, p.batch, p.heads_q, p.seqlen_q,
              p.head_dim, int(p.mask.causal), median, flops / median / 1e9);
  return 0;
}
