// The C ABI (kernels/include/flashlab.h) refuses every caller error with FLASHLAB_REFUSED and a message
// naming the input, before any CUDA call: these tests need no GPU. The tensors are fake device
// addresses, never dereferenced. Where no device exists, an accepted call reaches the first CUDA
// call and comes back FLASHLAB_ERROR naming it: that shows the checks let a valid call through.
// With a device, accepted calls are not made (they would launch on the fake addresses); the GPU
// tests (tests/kernels/) run real ones.
#include "flashlab.h"

#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "catch.hpp"

#ifndef FLASHLAB_ABI_HAS_SM90A
#define FLASHLAB_ABI_HAS_SM90A 0
#endif

namespace {

bool device_present() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// A fake device address: slot * 2^44 bytes (16 TiB apart, so even the widest strides below
// stay inside their slot), 16-byte aligned.
void* address(std::uintptr_t slot, std::uintptr_t byte_offset = 0) {
  return reinterpret_cast<void*>((slot << 44) + byte_offset);
}

// A tensor in the flash layout [batch, seqlen, heads, dim] (strides in elements).
struct Tensor {
  void* data = nullptr;
  std::int64_t strides[3] = {0, 0, 0};
};

Tensor flash(void* data, int seqlen, int heads, int dim) {
  return {data, {static_cast<std::int64_t>(seqlen) * heads * dim, static_cast<std::int64_t>(heads) * dim, dim}};
}

// One call's arguments: a valid bf16 problem (batch 2, heads 4 / 2, seqlen 64 / 96, head_dim 64)
// with its tensors, which each test breaks in one place.
struct Call {
  FlashlabProblem problem{2, 2, 4, 2, 64, 96, 64, 0.0, 0, 1, -1, -1, nullptr, nullptr, nullptr, nullptr};
  Tensor q = flash(address(1), 64, 4, 64), k = flash(address(2), 96, 2, 64), v = flash(address(3), 96, 2, 64);
  Tensor o = flash(address(4), 64, 4, 64), lse = {address(5), {4 * 64, 1, 64}};
  Tensor d_o = flash(address(6), 64, 4, 64), dq = flash(address(7), 64, 4, 64);
  Tensor dk = flash(address(8), 96, 2, 64), dv = flash(address(9), 96, 2, 64);
  int deterministic = 0;
  int generation = 2;  // of the backward
  bool null_problem = false, null_q_strides = false;

  const FlashlabProblem* problem_pointer() const { return null_problem ? nullptr : &problem; }
  const std::int64_t* q_strides() const { return null_q_strides ? nullptr : q.strides; }
  int forward(int generation) {
    return flashlab_forward(generation, problem_pointer(), q.data, q_strides(), k.data, k.strides, v.data, v.strides,
                            o.data, o.strides, static_cast<float*>(lse.data), lse.strides, nullptr);
  }
  int forward_steps(int ping_pong, int overlap, int persistent) {
    return flashlab_fa3_forward_steps(ping_pong, overlap, persistent, problem_pointer(), q.data, q_strides(), k.data,
                                      k.strides, v.data, v.strides, o.data, o.strides, static_cast<float*>(lse.data),
                                      lse.strides, nullptr);
  }
  int backward() {
    return flashlab_backward(generation, problem_pointer(), deterministic, q.data, q_strides(), k.data, k.strides,
                             v.data, v.strides, o.data, o.strides, static_cast<float*>(lse.data), lse.strides, d_o.data, d_o.strides,
                             dq.data, dq.strides, dk.data, dk.strides, dv.data, dv.strides, nullptr);
  }
};

std::string last_error() { return flashlab_last_error(); }

// The call was refused, naming `input`, with the allowed range.
#define REQUIRE_REFUSED(call_expression, input)                                        \
  do {                                                                                 \
    const int code = (call_expression);                                                \
    const std::string message = last_error();                                          \
    INFO(#call_expression << " -> " << code << ": " << message);                       \
    CHECK(code == FLASHLAB_REFUSED);                                                   \
    CHECK(message.find(input) != std::string::npos);                                   \
    CHECK(message.find("allowed") != std::string::npos);                               \
  } while (false)

// The call passed every check: without a device it stops at the first CUDA call (FLASHLAB_ERROR,
// a CUDA message); with one it is not made.
#define CHECK_ACCEPTED(call_expression)                                                \
  do {                                                                                 \
    if (!device_present()) {                                                           \
      const int code = (call_expression);                                              \
      const std::string message = last_error();                                        \
      INFO(#call_expression << " -> " << code << ": " << message);                     \
      CHECK(code == FLASHLAB_ERROR);                                                   \
      CHECK(message.find("failed") != std::string::npos);                              \
    }                                                                                  \
  } while (false)

// Varlen offsets of three sequences, on the "host" (real arrays, which must outlive the calls)
// and the "device" (fake addresses).
struct Varlen {
  std::vector<int> q = {0, 64, 65, 100}, k = {0, 10, 106, 107};  // the longest: 64 queries, 96 keys
  void attach(Call& call) const {
    FlashlabProblem& problem = call.problem;
    problem.batch = 3;
    problem.cu_seqlens_q_host = q.data(), problem.cu_seqlens_k_host = k.data();
    problem.cu_seqlens_q_device = static_cast<const int*>(address(10));
    problem.cu_seqlens_k_device = static_cast<const int*>(address(11));
    call.lse.strides[1] = 4, call.lse.strides[2] = 1;  // LSE of packed rows: [rows, heads]
  }
};

}  // namespace

TEST_CASE("C ABI: the library's version is the header's; which generations it has code for", "[abi]") {
  CHECK(flashlab_abi_version() == FLASHLAB_ABI_VERSION);
  CHECK(flashlab_generation_built(1) == 1);
  CHECK(flashlab_generation_built(2) == 1);
  CHECK(flashlab_generation_built(3) == (FLASHLAB_ABI_HAS_SM90A ? 1 : 0));
  CHECK(last_error().empty());
  for (int generation : {0, 4, -1}) {
    CHECK(flashlab_generation_built(generation) == -1);
    CHECK(last_error().find("generation = " + std::to_string(generation)) != std::string::npos);
    CHECK(last_error().find("allowed") != std::string::npos);
  }
}

TEST_CASE("C ABI: a valid problem passes every check of every entry", "[abi]") {
  Call call;
  CHECK_ACCEPTED(call.forward(2));
  CHECK_ACCEPTED(call.backward());
  Call fp16;
  fp16.problem.dtype = 1;
  CHECK_ACCEPTED(fp16.forward(1));
  if (FLASHLAB_ABI_HAS_SM90A) {
    CHECK_ACCEPTED(call.forward(3));
    CHECK_ACCEPTED(call.forward_steps(1, 1, 0));
  } else {
    REQUIRE_REFUSED(call.forward(3), "no sm_90a code");
  }
  const Varlen varlen{};
  Call varlen_call;
  varlen.attach(varlen_call);
  CHECK_ACCEPTED(varlen_call.forward(2));
  CHECK_ACCEPTED(varlen_call.backward());
}

TEST_CASE("C ABI: a null problem, codes that are not codes, and the scale", "[abi]") {
  Call call;
  call.null_problem = true;
  REQUIRE_REFUSED(call.forward(2), "problem is null");
  REQUIRE_REFUSED(call.forward_steps(1, 1, 0), "problem is null");
  REQUIRE_REFUSED(call.backward(), "problem is null");

  for (int generation : {0, 4, -1}) {
    Call bad;
    REQUIRE_REFUSED(bad.forward(generation), "generation = " + std::to_string(generation));
  }
  for (int dtype : {0, 3}) {
    Call bad;
    bad.problem.dtype = dtype;
    REQUIRE_REFUSED(bad.forward(2), "dtype = " + std::to_string(dtype));
  }
  Call causal;
  causal.problem.causal = 5;
  REQUIRE_REFUSED(causal.forward(2), "causal = 5");
  Call alignment;
  alignment.problem.alignment = 7;
  REQUIRE_REFUSED(alignment.forward(2), "alignment = 7");
  Call window;
  window.problem.window_left = -2;
  REQUIRE_REFUSED(window.forward(2), "window_left = -2");

  for (double scale : {1e300, 1e39, -0.5, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    Call bad;
    bad.problem.softmax_scale = scale;
    REQUIRE_REFUSED(bad.forward(2), "softmax_scale");
    REQUIRE_REFUSED(bad.backward(), "softmax_scale");
  }
  Call scaled;
  scaled.problem.softmax_scale = 0.07;
  CHECK_ACCEPTED(scaled.forward(2));

  Call flags;
  REQUIRE_REFUSED(flags.forward_steps(2, 1, 0), "ping_pong = 2");
  REQUIRE_REFUSED(flags.forward_steps(1, -1, 0), "intra_warpgroup_overlap = -1");
  REQUIRE_REFUSED(flags.forward_steps(1, 1, 9), "persistent = 9");
  flags.deterministic = 3;
  REQUIRE_REFUSED(flags.backward(), "deterministic = 3");
  flags.deterministic = 0;
  flags.generation = 1;
  REQUIRE_REFUSED(flags.backward(), "generation = 1");
}

TEST_CASE("C ABI: varlen offsets, host and device, against batch and seqlen", "[abi]") {
  const Varlen varlen{};
  Call only_q;
  varlen.attach(only_q);
  only_q.problem.cu_seqlens_k_host = nullptr;
  REQUIRE_REFUSED(only_q.forward(2), "cu_seqlens_k_host is null while cu_seqlens_q_host is set");
  Call only_k;
  varlen.attach(only_k);
  only_k.problem.cu_seqlens_q_host = nullptr;
  REQUIRE_REFUSED(only_k.forward(2), "cu_seqlens_q_host is null while cu_seqlens_k_host is set");
  Call one_device;
  varlen.attach(one_device);
  one_device.problem.cu_seqlens_k_device = nullptr;
  REQUIRE_REFUSED(one_device.backward(), "cu_seqlens_k_device is null");

  // Device offsets alone once made the problem silently dense; host offsets alone left the
  // kernels without theirs.
  Call device_only;
  varlen.attach(device_only);
  device_only.problem.cu_seqlens_q_host = device_only.problem.cu_seqlens_k_host = nullptr;
  REQUIRE_REFUSED(device_only.forward(2), "on the device only");
  Call host_only;
  varlen.attach(host_only);
  host_only.problem.cu_seqlens_q_device = host_only.problem.cu_seqlens_k_device = nullptr;
  REQUIRE_REFUSED(host_only.forward(2), "on the host only");

  // The batch is checked before batch + 1 entries are read (a negative one once reached a
  // vector's length_error, code 1).
  for (int batch : {0, -1, INT_MAX}) {
    Call bad;
    varlen.attach(bad);
    bad.problem.batch = batch;
    REQUIRE_REFUSED(bad.forward(2), "batch = " + std::to_string(batch));
  }

  struct Case {
    std::vector<int> q, k;
    int seqlen_q, seqlen_k;
    const char* input;
  };
  const Case cases[] = {
      {{1, 64, 65, 100}, varlen.k, 64, 96, "cu_seqlens_q[0] = 1"},
      {{0, 64, 64, 100}, varlen.k, 64, 96, "cu_seqlens_q: sequence 1 has length 0"},
      {{0, 64, 30, 100}, varlen.k, 64, 96, "cu_seqlens_q: sequence 1 has length -34"},
      {{0, 64, INT_MIN, 100}, varlen.k, 64, 96, "cu_seqlens_q: sequence 1 has length"},
      {varlen.q, {0, 10, 106, INT_MAX}, 64, 96, "cu_seqlens_k: sequence 2 has length"},
      // Longer than seqlen_q / seqlen_k: the grid is sized from them, rows would go uncomputed.
      {varlen.q, varlen.k, 63, 96, "cu_seqlens_q: sequence 0 has length 64"},
      {varlen.q, varlen.k, 64, 95, "cu_seqlens_k: sequence 1 has length 96"},
  };
  for (const Case& c : cases) {
    Call bad;
    varlen.attach(bad);
    bad.problem.cu_seqlens_q_host = c.q.data(), bad.problem.cu_seqlens_k_host = c.k.data();
    bad.problem.seqlen_q = c.seqlen_q, bad.problem.seqlen_k = c.seqlen_k;
    REQUIRE_REFUSED(bad.forward(2), c.input);
    REQUIRE_REFUSED(bad.backward(), c.input);
  }
  Call upper_bound;  // seqlen above the longest sequence (flash-attention's max_seqlen) is fine
  varlen.attach(upper_bound);
  upper_bound.problem.seqlen_q = upper_bound.problem.seqlen_k = 4096;
  CHECK_ACCEPTED(upper_bound.forward(2));
}

TEST_CASE("C ABI: null, zero and overflowing strides, null and misaligned data", "[abi]") {
  Call no_strides;
  no_strides.null_q_strides = true;
  REQUIRE_REFUSED(no_strides.forward(2), "q_strides is null");
  REQUIRE_REFUSED(no_strides.backward(), "q_strides is null");

  const struct {
    int index;
    std::int64_t value;
    const char* input;
  } zero_strides[] = {{0, 0, "q.batch_stride = 0 with 2 batches"},
                      {1, 0, "q.row_stride = 0 with 64 rows"},
                      {2, 0, "q.head_stride = 0 with 4 heads"},
                      {1, -256, "q.row_stride = -256"}};
  for (const auto& entry : zero_strides) {
    Call bad;
    bad.q.strides[entry.index] = entry.value;
    REQUIRE_REFUSED(bad.forward(2), entry.input);
    REQUIRE_REFUSED(bad.backward(), entry.input);
  }
  Call one_batch;  // an extent of 1 makes its stride irrelevant
  one_batch.problem.batch = 1;
  one_batch.q.strides[0] = one_batch.o.strides[0] = 0;
  CHECK_ACCEPTED(one_batch.forward(2));
  const Varlen varlen{};
  Call varlen_batch;  // varlen ignores batch_stride
  varlen.attach(varlen_batch);
  varlen_batch.k.strides[0] = 0;
  CHECK_ACCEPTED(varlen_batch.forward(2));

  Call past_int64;  // 95 rows x 2^56 elements fits int64, x 2 bytes does not
  past_int64.k.strides[1] = std::int64_t{1} << 56;
  REQUIRE_REFUSED(past_int64.forward(2), "k: strides");
  REQUIRE_REFUSED(past_int64.forward(2), "int64");
  Call product_overflow;  // 63 rows x 2^60 elements overflows the product itself
  product_overflow.o.strides[1] = std::int64_t{1} << 60;
  REQUIRE_REFUSED(product_overflow.forward(2), "o: strides");
  Call address_space;  // fits int64 but runs past the end of the address space
  address_space.v.data = reinterpret_cast<void*>(std::numeric_limits<std::uintptr_t>::max() - 1023);
  REQUIRE_REFUSED(address_space.forward(2), "v: strides");

  Call null_data;
  null_data.v.data = nullptr;
  REQUIRE_REFUSED(null_data.forward(2), "v is null");
  Call misaligned;
  misaligned.k.data = address(2, 8);
  REQUIRE_REFUSED(misaligned.forward(2), "k is not 16-byte aligned");
  Call odd_stride;
  odd_stride.q.strides[1] = 4 * 64 + 4;
  REQUIRE_REFUSED(odd_stride.forward(2), "q.row_stride = 260");
}

TEST_CASE("C ABI: outputs that share memory with themselves or another argument", "[abi]") {
  Call o_is_q;
  o_is_q.o = o_is_q.q;
  REQUIRE_REFUSED(o_is_q.forward(2), "o shares memory with q");
  Call o_in_k;  // a partial overlap: o starts inside k
  o_in_k.o.data = address(2, 4096);
  REQUIRE_REFUSED(o_in_k.forward(2), "o shares memory with k");
  Call lse_in_o;
  lse_in_o.lse.data = address(4, 1024);
  REQUIRE_REFUSED(lse_in_o.forward(2), "o shares memory with lse");
  Call o_self;  // heads 64 elements wide, 8 apart: each head writes over the next
  o_self.o.strides[2] = 8;
  REQUIRE_REFUSED(o_self.forward(2), "o.head_stride = 8 makes elements of the output share memory");
  Call lse_self;
  lse_self.lse.strides[1] = 0;
  REQUIRE_REFUSED(lse_self.forward(2), "lse.row_stride = 0 with 64 rows");
  const Varlen varlen{};
  Call offsets_in_o;  // the device offsets are read while o is written
  varlen.attach(offsets_in_o);
  offsets_in_o.problem.cu_seqlens_q_device = static_cast<const int*>(address(4, 64));
  REQUIRE_REFUSED(offsets_in_o.forward(2), "o shares memory with cu_seqlens_q");

  Call dq_is_q;
  dq_is_q.dq = dq_is_q.q;
  REQUIRE_REFUSED(dq_is_q.backward(), "dq shares memory with q");
  Call dk_is_dv;
  dk_is_dv.dv = dk_is_dv.dk;
  REQUIRE_REFUSED(dk_is_dv.backward(), "dk shares memory with dv");
  Call dq_is_d_o;
  dq_is_d_o.dq = dq_is_d_o.d_o;
  REQUIRE_REFUSED(dq_is_d_o.backward(), "dq shares memory with d_o");
  Call dv_in_v;
  dv_in_v.dv.data = address(3, 128);
  REQUIRE_REFUSED(dv_in_v.backward(), "dv shares memory with v");

  // One buffer [batch, seqlen, 3, heads, dim] holding q, k, v (inputs) and one holding dq, dk, dv
  // (outputs): interleaved, disjoint, accepted. Shifted by one column, dk would meet dq.
  Call packed;
  packed.problem.heads_kv = 4, packed.problem.seqlen_k = 64;
  const std::int64_t row = 3 * 4 * 64, batch = 64 * row;
  auto view = [&](std::uintptr_t slot, int which) {
    return Tensor{address(slot, static_cast<std::uintptr_t>(which) * 4 * 64 * 2), {batch, row, 64}};
  };
  packed.q = view(1, 0), packed.k = view(1, 1), packed.v = view(1, 2);
  packed.dq = view(7, 0), packed.dk = view(7, 1), packed.dv = view(7, 2);
  packed.o = flash(address(4), 64, 4, 64), packed.d_o = flash(address(6), 64, 4, 64);
  CHECK_ACCEPTED(packed.backward());
  Call shifted = packed;
  shifted.dk.data = address(7, 4 * 64 * 2 - 16);
  REQUIRE_REFUSED(shifted.backward(), "dq shares memory with dk");
}

TEST_CASE("C ABI: what each kernel cannot do is refused without a device", "[abi]") {
  Call fa1_bf16;
  REQUIRE_REFUSED(fa1_bf16.forward(1), "dtype bf16");
  Call fa1_wide;
  fa1_wide.problem.dtype = 1, fa1_wide.problem.head_dim = 192;
  REQUIRE_REFUSED(fa1_wide.forward(1), "head_dim = 192");
  Call fa2_odd;
  fa2_odd.problem.head_dim = 59;
  REQUIRE_REFUSED(fa2_odd.forward(2), "head_dim = 59");
  REQUIRE_REFUSED(fa2_odd.forward(3), "head_dim = 59");
  REQUIRE_REFUSED(fa2_odd.backward(), "head_dim = 59");
  Call gqa;
  gqa.problem.heads_kv = 3;
  REQUIRE_REFUSED(gqa.forward(2), "heads_q = 4 is not a multiple of heads_kv = 3");

  // CUDA's grid: at most 65535 blocks in y and z (heads, batch).
  Call many_heads;
  many_heads.problem.heads_q = many_heads.problem.heads_kv = 65536;
  many_heads.problem.seqlen_q = many_heads.problem.seqlen_k = 1;
  many_heads.problem.batch = 1;
  for (Tensor* t : {&many_heads.q, &many_heads.k, &many_heads.v, &many_heads.o, &many_heads.d_o, &many_heads.dq,
                    &many_heads.dk, &many_heads.dv}) {
    *t = flash(t->data, 1, 65536, 64);
  }
  many_heads.lse.strides[2] = 1;
  REQUIRE_REFUSED(many_heads.forward(2), "heads_q = 65536 (grid dimension y)");
  REQUIRE_REFUSED(many_heads.backward(), "heads_q = 65536 (grid dimension y)");
  Call many_batches;
  many_batches.problem.batch = 70000;
  many_batches.problem.seqlen_q = many_batches.problem.seqlen_k = 1;
  for (Tensor* t : {&many_batches.q, &many_batches.o, &many_batches.d_o, &many_batches.dq}) *t = flash(t->data, 1, 4, 64);
  for (Tensor* t : {&many_batches.k, &many_batches.v, &many_batches.dk, &many_batches.dv}) *t = flash(t->data, 1, 2, 64);
  REQUIRE_REFUSED(many_batches.forward(2), "batch = 70000 (grid dimension z)");
  many_batches.problem.dtype = 1;
  REQUIRE_REFUSED(many_batches.forward(1), "batch = 70000 (grid dimension y)");

  if (FLASHLAB_ABI_HAS_SM90A) {
    Call steps;  // the ablation's sets exist at head_dim 128 in bf16 only
    REQUIRE_REFUSED(steps.forward_steps(0, 0, 0), "fa3_forward_steps: steps {ping_pong 0");
    steps.problem.head_dim = 128;
    for (Tensor* t : {&steps.q, &steps.o}) *t = flash(t->data, 64, 4, 128);
    for (Tensor* t : {&steps.k, &steps.v}) *t = flash(t->data, 96, 2, 128);
    CHECK_ACCEPTED(steps.forward_steps(0, 0, 0));
    REQUIRE_REFUSED(steps.forward_steps(1, 0, 1), "fa3_forward_steps: steps {ping_pong 1");
    // The FA3 backward's tile order counts blocks in int: 1024 sequences x 1024 KV heads x 2049
    // key blocks of 128.
    const int long_rows = 2049 * 128;
    Call many_key_blocks;
    many_key_blocks.generation = 3;
    many_key_blocks.problem.batch = 1024, many_key_blocks.problem.heads_q = many_key_blocks.problem.heads_kv = 1024;
    many_key_blocks.problem.seqlen_q = 1, many_key_blocks.problem.seqlen_k = long_rows;
    many_key_blocks.problem.head_dim = 8;
    for (Tensor* t : {&many_key_blocks.q, &many_key_blocks.o, &many_key_blocks.d_o, &many_key_blocks.dq}) {
      *t = flash(t->data, 1, 1024, 8);
    }
    for (Tensor* t : {&many_key_blocks.k, &many_key_blocks.v, &many_key_blocks.dk, &many_key_blocks.dv}) {
      *t = flash(t->data, long_rows, 1024, 8);
    }
    many_key_blocks.lse.strides[0] = 1024, many_key_blocks.lse.strides[2] = 1;
    REQUIRE_REFUSED(many_key_blocks.backward(), "batch x heads_kv x key blocks = 2148532224");
    // The forward's tile order too: one sequence of 2^24 queries x 2^15 heads, over 2^31 tiles at
    // any block height up to 256; the rows stay within int.
    const int long_queries = 1 << 24, heads = 1 << 15;
    Call many_query_blocks;
    many_query_blocks.problem.batch = 1, many_query_blocks.problem.heads_q = many_query_blocks.problem.heads_kv = heads;
    many_query_blocks.problem.seqlen_q = long_queries, many_query_blocks.problem.seqlen_k = 1;
    many_query_blocks.problem.head_dim = 8;
    for (Tensor* t : {&many_query_blocks.q, &many_query_blocks.o}) {
      *t = flash(t->data, long_queries, heads, 8);
      t->strides[0] = 0;  // one sequence: no batch stride (TMA's strides stay below 2^39 elements)
    }
    for (Tensor* t : {&many_query_blocks.k, &many_query_blocks.v}) *t = flash(t->data, 1, heads, 8);
    many_query_blocks.lse.strides[0] = std::int64_t{heads} * long_queries, many_query_blocks.lse.strides[1] = 1;
    many_query_blocks.lse.strides[2] = long_queries;
    REQUIRE_REFUSED(many_query_blocks.forward(3), "batch x heads_q x query blocks = ");
    Call tma_stride;  // TMA strides stay below 2^40 bytes
    tma_stride.problem.batch = 1;
    tma_stride.k.strides[2] = std::int64_t{1} << 39;
    REQUIRE_REFUSED(tma_stride.forward(3), "head_stride = 549755813888");
  }
}

TEST_CASE("C ABI: the GEMM's shapes, pointers and aliasing", "[abi]") {
  void* a = address(1);
  void* b = address(2);
  void* c = address(3);
  REQUIRE_REFUSED(flashlab_sm90_gemm_bf16(a, b, c, 0, 64, 64, nullptr), "m, n, k = 0, 64, 64");
  REQUIRE_REFUSED(flashlab_sm90_gemm_bf16(a, b, c, 64, 60, 64, nullptr), "n = 60");
  REQUIRE_REFUSED(flashlab_sm90_gemm_bf16(nullptr, b, c, 64, 64, 64, nullptr), "non-null");
  REQUIRE_REFUSED(flashlab_sm90_gemm_bf16(a, b, a, 64, 64, 64, nullptr), "c shares memory with a");
  REQUIRE_REFUSED(flashlab_sm90_gemm_bf16(a, b, address(2, 64 * 64 * 2 - 16), 64, 64, 64, nullptr),
                  "c shares memory with b");
  if (FLASHLAB_ABI_HAS_SM90A) {
    CHECK_ACCEPTED(flashlab_sm90_gemm_bf16(a, b, c, 64, 64, 64, nullptr));
  } else {
    REQUIRE_REFUSED(flashlab_sm90_gemm_bf16(a, b, c, 64, 64, 64, nullptr), "no sm_90a code");
  }
}

// A valid decode call (bf16, batch 2, heads 8 / 2, one query token, head_dim 128) against a paged
// cache of 8 pages of 64 slots (4 pages per sequence), with host copies of the lengths and the
// block table, broken in one place per check.
struct DecodeCall {
  FlashlabProblem problem{2, 2, 8, 2, 1, 256, 128, 0.0, 0, 1, -1, -1, nullptr, nullptr, nullptr, nullptr};
  Tensor q = flash(address(1), 1, 8, 128), o = flash(address(2), 1, 8, 128), lse = {address(3), {8, 8, 1}};
  Tensor k_cache = flash(address(4), 64, 2, 128), v_cache = flash(address(5), 64, 2, 128);
  std::vector<int> lengths = {10, 200}, table = {0, 1, 2, 3, 4, 5, 6, 7};
  FlashlabKvCache cache{};
  int num_splits = 0;
  void prepare() {
    cache.k_cache = k_cache.data, cache.k_cache_strides = k_cache.strides;
    cache.v_cache = v_cache.data, cache.v_cache_strides = v_cache.strides;
    cache.block_table = static_cast<const int*>(address(6)), cache.cache_seqlens = static_cast<const int*>(address(7));
    cache.host_cache_seqlens = lengths.data(), cache.host_block_table = table.data();
  }
  int call() {
    return flashlab_decode(&problem, &cache, num_splits, q.data, q.strides, o.data, o.strides,
                           static_cast<float*>(lse.data), lse.strides, nullptr, 0, 0, nullptr);
  }
  int run() { return prepare(), call(); }
  DecodeCall() { cache.max_pages_per_sequence = 4, cache.num_pages = 8, cache.page_size = 64; }
};

TEST_CASE("C ABI: decoding refuses bad block tables, page sizes and lengths before any launch", "[abi]") {
  {
    DecodeCall call;
    CHECK_ACCEPTED(call.run());
  }
  {
    DecodeCall call;
    call.table[5] = 9;  // sequence 1's second page: past num_pages
    REQUIRE_REFUSED(call.run(), "block_table[1][1] = 9");
  }
  {
    DecodeCall call;
    call.table[0] = -1;
    REQUIRE_REFUSED(call.run(), "block_table[0][0] = -1");
  }
  {
    DecodeCall call;
    call.lengths[1] = 257;  // beyond the 4 x 64 keys a sequence's pages hold
    REQUIRE_REFUSED(call.run(), "cache_seqlens[1] = 257");
  }
  {
    DecodeCall call;
    call.cache.page_size = 48;
    REQUIRE_REFUSED(call.run(), "page_size = 48");
  }
  {
    DecodeCall call;
    call.problem.seqlen_k = 300;  // not max_pages_per_sequence * page_size
    REQUIRE_REFUSED(call.run(), "seqlen_k = 300");
  }
  {
    DecodeCall call;
    call.problem.seqlen_q = 17;
    call.q = flash(address(1), 17, 8, 128), call.o = flash(address(2), 17, 8, 128);
    REQUIRE_REFUSED(call.run(), "seqlen_q = 17");
  }
  {
    DecodeCall call;
    call.num_splits = 300;
    REQUIRE_REFUSED(call.run(), "num_splits = 300");
  }
  {
    DecodeCall call;
    call.cache.seqlen_new = 2;  // appending without the new tokens' K and V
    REQUIRE_REFUSED(call.run(), "k_new_strides is null");
  }
  {
    DecodeCall call;
    call.o = call.q;  // the output over the input
    REQUIRE_REFUSED(call.run(), "o shares memory with q");
  }
  {
    DecodeCall call;
    call.problem.window_left = 16;
    REQUIRE_REFUSED(call.run(), "window_left = 16");
  }
  {
    DecodeCall call;  // a contiguous cache given page fields
    call.prepare();
    call.cache.block_table = nullptr;
    REQUIRE_REFUSED(call.call(), "without a block_table");
  }
  DecodeCall call;
  call.prepare();
  REQUIRE_REFUSED(flashlab_decode_workspace_bytes(&call.problem, &call.cache, 0, nullptr), "bytes is null");
}
