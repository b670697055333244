// The FA2 backward kernel (kernels/02_fa2_sm80/backward_*) against the double-precision oracle, with
// the official tests' gradient rule: max error <= 3x that of a naive implementation in the same
// precision, plus a tiny slack. The forward inputs of the backward (O rounded to the dtype and the
// LSE) come from the oracle, so a forward-kernel bug cannot hide a backward one.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "catch.hpp"
#include "kernels/attention_api.hpp"
#include "reference/backward_check.hpp"
#include "reference/device_layouts.hpp"
#include "reference/reference_check.hpp"

using namespace flashlab;

namespace {

bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

void cuda_ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

struct DeviceBuffer {
  void* data = nullptr;
  std::size_t bytes = 0;
  explicit DeviceBuffer(std::size_t size) : bytes(std::max<std::size_t>(size, 16)) { cuda_ok(cudaMalloc(&data, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(data); }
  DeviceBuffer(DeviceBuffer&& other) noexcept : data(other.data), bytes(other.bytes) { other.data = nullptr; }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
};

DeviceBuffer upload(const HostTensor& tensor) {
  std::vector<std::uint16_t> bits(tensor.values.size());
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = reference::encode_16bit(tensor.dtype, tensor.values[i]);
  DeviceBuffer buffer(bits.size() * 2);
  cuda_ok(cudaMemcpy(buffer.data, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), "upload");
  return buffer;
}

void download(const DeviceBuffer& buffer, HostTensor& tensor) {
  std::vector<std::uint16_t> bits(tensor.values.size());
  cuda_ok(cudaMemcpy(bits.data(), buffer.data, bits.size() * 2, cudaMemcpyDeviceToHost), "download");
  for (std::size_t i = 0; i < bits.size(); ++i) tensor.values[i] = reference::decode_16bit(tensor.dtype, bits[i]);
}

std::vector<std::uint16_t> raw_bits(const DeviceBuffer& buffer, std::size_t elements) {
  std::vector<std::uint16_t> bits(elements);
  cuda_ok(cudaMemcpy(bits.data(), buffer.data, elements * 2, cudaMemcpyDeviceToHost), "download");
  return bits;
}

// ---------------------------------------------------------------------------------------------
// One backward run on the device from host inputs; gradients come back in `x`.
struct DeviceProblem {
  const Problem& problem;
  AttentionTensors& x;
  DeviceBuffer q, k, v, o, d_o, dq, dk, dv, lse, cu_q, cu_k;

  DeviceProblem(const Problem& problem, AttentionTensors& tensors)
      : problem(problem), x(tensors), q(upload(x.Q)), k(upload(x.K)), v(upload(x.V)), o(upload(x.O)),
        d_o(upload(x.dO)), dq(x.dQ.values.size() * 2), dk(x.dK.values.size() * 2), dv(x.dV.values.size() * 2),
        lse(x.LSE.values.size() * 4), cu_q((problem.batch + 1) * 4), cu_k((problem.batch + 1) * 4) {
    cuda_ok(cudaMemcpy(lse.data, x.LSE.values.data(), x.LSE.values.size() * 4, cudaMemcpyHostToDevice), "upload LSE");
    if (problem.varlen()) {
      cuda_ok(cudaMemcpy(cu_q.data, problem.cu_seqlens_q.data(), (problem.batch + 1) * 4, cudaMemcpyHostToDevice), "cu_q");
      cuda_ok(cudaMemcpy(cu_k.data, problem.cu_seqlens_k.data(), (problem.batch + 1) * 4, cudaMemcpyHostToDevice), "cu_k");
    }
  }

  void run(bool deterministic) {
    // Poison: 0xffff is a NaN in both bf16 and fp16, so an unwritten element fails the check.
    cuda_ok(cudaMemset(dq.data, 0xff, dq.bytes), "poison dQ");
    cuda_ok(cudaMemset(dk.data, 0xff, dk.bytes), "poison dK");
    cuda_ok(cudaMemset(dv.data, 0xff, dv.bytes), "poison dV");
    kernels::BackwardArgs args;
    args.q = kernels::flash_layout(q.data, problem, problem.heads_q, problem.head_dim, true);
    args.k = kernels::flash_layout(k.data, problem, problem.heads_kv, problem.head_dim, false);
    args.v = kernels::flash_layout(v.data, problem, problem.heads_kv, problem.head_dim, false);
    args.o = kernels::flash_layout(o.data, problem, problem.heads_q, problem.head_dim, true);
    args.d_o = kernels::flash_layout(d_o.data, problem, problem.heads_q, problem.head_dim, true);
    args.dq = kernels::flash_layout(dq.data, problem, problem.heads_q, problem.head_dim, true);
    args.dk = kernels::flash_layout(dk.data, problem, problem.heads_kv, problem.head_dim, false);
    args.dv = kernels::flash_layout(dv.data, problem, problem.heads_kv, problem.head_dim, false);
    args.lse = kernels::flash_layout(lse.data, problem, problem.heads_q, 1, true);
    if (problem.varlen()) {
      args.cu_seqlens_q = static_cast<const int*>(cu_q.data);
      args.cu_seqlens_k = static_cast<const int*>(cu_k.data);
    }
    args.deterministic = deterministic;
    kernels::fa2_backward(problem, args);
    cuda_ok(cudaDeviceSynchronize(), "fa2_backward");
    download(dq, x.dQ);
    download(dk, x.dK);
    download(dv, x.dV);
  }
};

void check_backward(const Problem& problem, bool deterministic = false) {
  const auto seed = reference::fresh_seed();
  AttentionTensors x = reference::backward_inputs(problem, seed);
  const OracleResult oracle = oracle_attention(problem, x, &x.dO);
  const reference::NaiveGradients naive = reference::naive_backward_same_precision(problem, x);
  DeviceProblem device(problem, x);
  device.run(deterministic);
  INFO(reference::describe(problem) << (deterministic ? ", deterministic" : "") << ", seed " << seed);
  const reference::Tolerance rule{3.0, 1e-4};
  const struct {
    const char* name;
    const HostTensor& got;
    const HostTensor& naive;
    const OracleTensor& expected;
  } gradients[] = {{"dQ", x.dQ, naive.dQ, oracle.dQ}, {"dK", x.dK, naive.dK, oracle.dK}, {"dV", x.dV, naive.dV, oracle.dV}};
  for (const auto& gradient : gradients) {
    const auto error = reference::compare(gradient.got, gradient.expected);
    const auto naive_error = reference::compare(gradient.naive, gradient.expected);
    INFO(error.describe(gradient.name) << "; naive " << naive_error.max_error);
    CHECK(reference::within_rule(error, naive_error.max_error, rule));
  }
}

Problem make_problem(int seqlen_q, int seqlen_k, int head_dim, DType dtype, int batch, int heads_q, int heads_kv) {
  Problem problem;
  problem.batch = batch;
  problem.heads_q = heads_q;
  problem.heads_kv = heads_kv;
  problem.seqlen_q = seqlen_q;
  problem.seqlen_k = seqlen_k;
  problem.head_dim = head_dim;
  problem.dtype = dtype;
  return problem;
}

void set_causal(Problem& problem, int kind) {  // 0: none, 1: bottom-right, 2: top-left
  problem.mask.causal = kind != 0;
  problem.mask.alignment = kind == 2 ? CausalAlignment::top_left : CausalAlignment::bottom_right;
}

#define REQUIRE_GPU_OR_SKIP()                              \
  if (!have_gpu()) {                                       \
    WARN("no CUDA device: FA2 backward test skipped");     \
    return;                                                \
  }

}  // namespace

TEST_CASE("FA2 backward kernel: odd shapes, causal both ways, GQA", "[gpu][fa2_backward]") {
  REQUIRE_GPU_OR_SKIP();
  const auto [seqlen_q, seqlen_k] =
      GENERATE(table<int, int>({{113, 203}, {128, 217}, {1, 1}, {239, 1}, {799, 3}, {1023, 1024}}));
  const int causal = GENERATE(0, 1, 2);
  const int head_dim = GENERATE(64, 128);
  const bool large = seqlen_q > 512;
  Problem problem = make_problem(seqlen_q, seqlen_k, head_dim, DType::bf16, large ? 1 : 2, large ? 2 : 4, large ? 1 : 2);
  set_causal(problem, causal);
  check_backward(problem);
}

TEST_CASE("FA2 backward kernel: fp16, head dims 32, 40, 96, MQA", "[gpu][fa2_backward]") {
  REQUIRE_GPU_OR_SKIP();
  const int head_dim = GENERATE(32, 40, 64, 96, 128);
  const int causal = GENERATE(0, 1);
  Problem problem = make_problem(177, 301, head_dim, DType::fp16, 2, 4, 1);
  set_causal(problem, causal);
  check_backward(problem);
}

TEST_CASE("FA2 backward kernel: head dims above 128", "[gpu][fa2_backward]") {
  REQUIRE_GPU_OR_SKIP();
  const int head_dim = GENERATE(160, 192, 256);
  const int causal = GENERATE(0, 1, 2);
  Problem problem = make_problem(113, 203, head_dim, DType::bf16, 2, 4, 2);
  set_causal(problem, causal);
  check_backward(problem, causal == 1);
}

TEST_CASE("FA2 backward kernel: sliding window and varlen", "[gpu][fa2_backward]") {
  REQUIRE_GPU_OR_SKIP();
  SECTION("window") {
    Problem problem = make_problem(300, 260, 64, DType::bf16, 2, 2, 2);
    problem.mask.window_left = 37;
    problem.mask.window_right = 11;
    check_backward(problem);
    problem.mask.causal = true;
    check_backward(problem, true);
  }
  SECTION("varlen") {
    Problem problem = make_problem(1, 1, 128, DType::bf16, 3, 4, 2);
    set_varlen(problem, {130, 1, 257}, {70, 200, 257});
    check_backward(problem);
    set_causal(problem, 1);
    check_backward(problem, true);
  }
}

TEST_CASE("FA2 backward kernel: deterministic mode is bitwise repeatable and correct", "[gpu][fa2_backward]") {
  REQUIRE_GPU_OR_SKIP();
  const int causal = GENERATE(0, 1);
  Problem problem = make_problem(640, 1100, 128, DType::bf16, 2, 4, 2);
  set_causal(problem, causal);
  check_backward(problem, true);

  const auto seed = reference::fresh_seed();
  AttentionTensors x = reference::backward_inputs(problem, seed);
  DeviceProblem device(problem, x);
  device.run(true);
  const auto dq0 = raw_bits(device.dq, x.dQ.values.size()), dk0 = raw_bits(device.dk, x.dK.values.size()),
             dv0 = raw_bits(device.dv, x.dV.values.size());
  for (int repeat = 0; repeat < 3; ++repeat) {
    device.run(true);
    INFO(reference::describe(problem) << ", seed " << seed << ", repeat " << repeat);
    CHECK(raw_bits(device.dq, x.dQ.values.size()) == dq0);
    CHECK(raw_bits(device.dk, x.dK.values.size()) == dk0);
    CHECK(raw_bits(device.dv, x.dV.values.size()) == dv0);
  }
}

TEST_CASE("FA2 backward kernel: deterministic mode under every mask and tiling", "[gpu][fa2_backward]") {
  // Each query block's key blocks take turns; a turn computed wrongly hangs or drops a
  // contribution. Both length orders, so some key blocks or query blocks see nothing.
  REQUIRE_GPU_OR_SKIP();
  const int head_dim = GENERATE(64, 128, 256);  // the 128 x 128, 128 x 64 and 64 x 64 tilings
  const auto [seqlen_q, seqlen_k] = GENERATE(table<int, int>({{300, 170}, {170, 300}}));
  const int mask = GENERATE(0, 1, 2, 3);
  Problem problem = make_problem(seqlen_q, seqlen_k, head_dim, DType::bf16, 2, 2, 1);
  if (mask == 3) {
    problem.mask.window_left = 37;
    problem.mask.window_right = 5;
  } else {
    set_causal(problem, mask);
  }
  check_backward(problem, true);
}

TEST_CASE("FA2 backward kernel: unsupported inputs are refused with a clear message", "[gpu][fa2_backward]") {
  Problem problem = make_problem(64, 64, 60, DType::bf16, 1, 1, 1);
  kernels::BackwardArgs args;
  CHECK_THROWS_AS(kernels::fa2_backward(problem, args), std::invalid_argument);
  problem.head_dim = 264;
  CHECK_THROWS_AS(kernels::fa2_backward(problem, args), std::invalid_argument);
  problem.head_dim = 64;
  problem.dtype = DType::fp32;
  CHECK_THROWS_AS(kernels::fa2_backward(problem, args), std::invalid_argument);
}

TEST_CASE("FA2 backward kernel on a small grid (for the sanitizers)", "[sanitizer_grid]") {
  REQUIRE_GPU_OR_SKIP();
  for (const int head_dim : {64, 128}) {
    for (const int causal : {0, 1}) {
      Problem problem = make_problem(77, 141, head_dim, DType::bf16, 1, 2, 1);
      set_causal(problem, causal);
      check_backward(problem, causal == 1);
    }
  }
}
