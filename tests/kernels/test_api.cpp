// The host API refuses what a kernel cannot do, naming the input; no silent fallback.
#include <cstddef>
#include <stdexcept>
#include <string>

#include "catch.hpp"
#include "kernels/attention_api.hpp"

using namespace flashlab;

namespace {

Problem small_problem() {
  Problem p;
  p.batch = 1, p.heads_q = 2, p.heads_kv = 2, p.seqlen_q = 64, p.seqlen_k = 64, p.head_dim = 64;
  p.dtype = DType::bf16;
  return p;
}

// A ForwardArgs over real device memory, one region per tensor (the API refuses an output that
// shares memory with another argument), so only the problem (or one field) is wrong.
struct Buffers {
  static constexpr std::size_t kRegionBytes = 256 << 10;  // the largest tensor here: 64 x 2 x 264 x 2 B
  void* data = nullptr;
  Buffers() { cudaMalloc(&data, 5 * kRegionBytes); }
  ~Buffers() { cudaFree(data); }
  void* region(int i) const { return static_cast<char*>(data) + i * kRegionBytes; }
  kernels::ForwardArgs args(const Problem& p) const {
    kernels::ForwardArgs a;
    a.q = kernels::flash_layout(region(0), p, p.heads_q, p.head_dim, true);
    a.k = kernels::flash_layout(region(1), p, p.heads_kv, p.head_dim, false);
    a.v = kernels::flash_layout(region(2), p, p.heads_kv, p.head_dim, false);
    a.o = kernels::flash_layout(region(3), p, p.heads_q, p.head_dim, true);
    a.lse = kernels::flash_layout(region(4), p, p.heads_q, 1, true);
    return a;
  }
};

std::string refusal(void (*kernel)(const Problem&, const kernels::ForwardArgs&), const Problem& p,
                    const kernels::ForwardArgs& args) {
  try {
    kernel(p, args);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "(accepted)";
}

}  // namespace

// (Catch2 2 and 3 name their substring matcher differently; a plain find works with both.)
#define CHECK_THAT_CONTAINS(text_expression, needle)        \
  do {                                                    \
    const std::string text = (text_expression);           \
    INFO("message: " << text << "; expected to contain: " << (needle)); \
    CHECK(text.find(needle) != std::string::npos);        \
  } while (false)

TEST_CASE("FA2 forward refuses unsupported inputs by name", "[api]") {
  Buffers buffers;
  Problem p = small_problem();
  CHECK(refusal(kernels::fa2_forward, p, buffers.args(p)) == "(accepted)");
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

  Problem odd = p;
  odd.head_dim = 59;
  CHECK_THAT_CONTAINS(refusal(kernels::fa2_forward, odd, buffers.args(odd)), "head_dim = 59");
  Problem wide = p;
  wide.head_dim = 264;
  CHECK_THAT_CONTAINS(refusal(kernels::fa2_forward, wide, buffers.args(wide)), "head_dim = 264");
  Problem fp32 = p;
  fp32.dtype = DType::fp32;
  CHECK_THAT_CONTAINS(refusal(kernels::fa2_forward, fp32, buffers.args(fp32)), "dtype fp32");
  Problem alibi = p;
  alibi.alibi_slopes = {0.5f, 0.25f};
  CHECK_THAT_CONTAINS(refusal(kernels::fa2_forward, alibi, buffers.args(alibi)), "alibi_slopes");
  Problem dropout = p;
  dropout.dropout.probability = 0.1f;
  CHECK_THAT_CONTAINS(refusal(kernels::fa2_forward, dropout, buffers.args(dropout)), "dropout");
  Problem softcap = p;
  softcap.softcap = 30.f;
  CHECK_THAT_CONTAINS(refusal(kernels::fa2_forward, softcap, buffers.args(softcap)), "softcap");
  Problem value_dim = p;
  value_dim.head_dim_v = 32;
  CHECK_THAT_CONTAINS(refusal(kernels::fa2_forward, value_dim, buffers.args(value_dim)), "head_dim_v");

  Problem varlen = p;
  set_varlen(varlen, {10, 20}, {10, 20});
  CHECK_THAT_CONTAINS(refusal(kernels::fa2_forward, varlen, buffers.args(varlen)), "cu_seqlens");

  auto misaligned = buffers.args(p);
  misaligned.k.row_stride = 130;
  CHECK_THAT_CONTAINS(refusal(kernels::fa2_forward, p, misaligned), "k.row_stride = 130");
  auto null_output = buffers.args(p);
  null_output.o.data = nullptr;
  CHECK_THAT_CONTAINS(refusal(kernels::fa2_forward, p, null_output), "o is null");
  auto in_place = buffers.args(p);
  in_place.o.data = in_place.q.data;
  CHECK_THAT_CONTAINS(refusal(kernels::fa2_forward, p, in_place), "o shares memory with q");
}

TEST_CASE("FA1 forward refuses bf16 and head dims over 128 by name", "[api]") {
  Buffers buffers;
  Problem p = small_problem();
  CHECK_THAT_CONTAINS(refusal(kernels::fa1_forward, p, buffers.args(p)), "dtype bf16");
  p.dtype = DType::fp16;
  CHECK(refusal(kernels::fa1_forward, p, buffers.args(p)) == "(accepted)");
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  p.head_dim = 192;
  CHECK_THAT_CONTAINS(refusal(kernels::fa1_forward, p, buffers.args(p)), "head_dim = 192");
}
