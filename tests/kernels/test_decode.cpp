// The decode rung (kernels/04_decode_sm80/) through the reference-test library: the problem's K
// and V are put into a KV cache (contiguous, or paged with the pages in a random order), the rest
// of every cache poisoned (NaN), so a key read past a sequence's length fails the case; O and LSE
// are held to the double-precision oracle by the 2x rule. Query tokens 1, 2, 4 (and 16) x GQA
// groups 1, 4, 8 x KV lengths 1, 127 and 128k + 3, causal among the query tokens, sequences of
// different lengths in one batch, the new tokens appended by the call (and checked in the cache
// afterwards), splits forced and chosen. The refusals (bad block tables, page sizes, lengths:
// before any launch) are tests/abi/'s, which need no device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch.hpp"
#include "kernels/attention_api.hpp"
#include "reference/attention_check.hpp"
#include "reference/device_attention.hpp"
#include "reference/reference_check.hpp"

using namespace flashlab;

namespace {

void cuda_ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// How the test lays the cache out around the problem's keys.
struct CacheLayout {
  int page_size = 0;     // 0: contiguous
  int spare_keys = 37;   // poisoned capacity past the longest sequence
  int appended = 0;      // the last keys of each sequence come as k_new, v_new (at most the shortest)
  int num_splits = 0;    // 0: chosen by the kernel's host code
};

struct DeviceArray {
  void* data = nullptr;
  explicit DeviceArray(std::size_t bytes) { cuda_ok(cudaMalloc(&data, std::max<std::size_t>(bytes, 16)), "cudaMalloc"); }
  ~DeviceArray() { cudaFree(data); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

// The reference library's problem (queries per sequence = the query tokens, keys per sequence =
// its cache length) run as a decode: K and V downloaded, scattered into a cache, and the kernel
// called on the uploaded Q with the library's O and LSE.
reference::ForwardImplementation decode_on_device(CacheLayout layout) {
  return reference::on_device([layout](const Problem& problem, const kernels::ForwardArgs& args) {
    const int batch = problem.batch, heads_kv = problem.heads_kv, head_dim = problem.head_dim;
    const std::int64_t row_elements = static_cast<std::int64_t>(heads_kv) * head_dim;
    std::vector<int> lengths(batch), first_row(batch);
    for (int b = 0; b < batch; ++b) {
      first_row[b] = problem.varlen() ? problem.cu_seqlens_k[b] : b * problem.seqlen_k;
      lengths[b] = problem.varlen() ? problem.cu_seqlens_k[b + 1] - problem.cu_seqlens_k[b] : problem.seqlen_k;
    }
    const int longest = *std::max_element(lengths.begin(), lengths.end());
    const int appended = std::min(layout.appended, *std::min_element(lengths.begin(), lengths.end()));
    const std::int64_t total_rows = problem.varlen() ? problem.cu_seqlens_k.back() : std::int64_t{batch} * problem.seqlen_k;
    std::vector<std::uint16_t> k_rows(total_rows * row_elements), v_rows(k_rows.size());
    cuda_ok(cudaMemcpy(k_rows.data(), args.k.data, k_rows.size() * 2, cudaMemcpyDeviceToHost), "download K");
    cuda_ok(cudaMemcpy(v_rows.data(), args.v.data, v_rows.size() * 2, cudaMemcpyDeviceToHost), "download V");

    // Capacity and pages; every slot poisoned (0xFFFF is NaN in fp16 and bf16).
    kernels::DecodeArgs decode;
    const bool paged = layout.page_size > 0;
    int capacity = longest + layout.spare_keys;
    int pages_per_sequence = 0, num_pages = 0;
    std::vector<int> block_table;
    if (paged) {
      pages_per_sequence = (capacity + layout.page_size - 1) / layout.page_size;
      capacity = pages_per_sequence * layout.page_size;
      num_pages = batch * pages_per_sequence + 3;  // spare pages nobody's table names
      std::vector<int> ids(num_pages);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), std::mt19937(static_cast<unsigned>(reference::fresh_seed())));
      block_table.assign(ids.begin(), ids.begin() + batch * pages_per_sequence);
    }
    const std::int64_t cache_rows = paged ? std::int64_t{num_pages} * layout.page_size : std::int64_t{batch} * capacity;
    std::vector<std::uint16_t> k_cache(cache_rows * row_elements, 0xFFFF), v_cache(k_cache.size(), 0xFFFF);
    std::vector<std::uint16_t> k_new(std::int64_t{batch} * appended * row_elements), v_new(k_new.size());
    auto cache_row = [&](int b, int key) -> std::int64_t {
      if (!paged) return std::int64_t{b} * capacity + key;
      return std::int64_t{block_table[b * pages_per_sequence + key / layout.page_size]} * layout.page_size + key % layout.page_size;
    };
    std::vector<int> cache_seqlens(batch);
    for (int b = 0; b < batch; ++b) {
      cache_seqlens[b] = lengths[b] - appended;
      for (int key = 0; key < lengths[b]; ++key) {
        const std::int64_t source = (first_row[b] + key) * row_elements;
        if (key < cache_seqlens[b]) {
          std::copy_n(k_rows.begin() + source, row_elements, k_cache.begin() + cache_row(b, key) * row_elements);
          std::copy_n(v_rows.begin() + source, row_elements, v_cache.begin() + cache_row(b, key) * row_elements);
        } else {
          const std::int64_t destination = (std::int64_t{b} * appended + key - cache_seqlens[b]) * row_elements;
          std::copy_n(k_rows.begin() + source, row_elements, k_new.begin() + destination);
          std::copy_n(v_rows.begin() + source, row_elements, v_new.begin() + destination);
        }
      }
    }
    DeviceArray k_device(k_cache.size() * 2), v_device(v_cache.size() * 2), k_new_device(k_new.size() * 2),
        v_new_device(v_new.size() * 2), seqlens_device(batch * sizeof(int)), table_device(block_table.size() * sizeof(int) + 4);
    cuda_ok(cudaMemcpy(k_device.data, k_cache.data(), k_cache.size() * 2, cudaMemcpyHostToDevice), "upload K cache");
    cuda_ok(cudaMemcpy(v_device.data, v_cache.data(), v_cache.size() * 2, cudaMemcpyHostToDevice), "upload V cache");
    cuda_ok(cudaMemcpy(k_new_device.data, k_new.data(), k_new.size() * 2, cudaMemcpyHostToDevice), "upload K new");
    cuda_ok(cudaMemcpy(v_new_device.data, v_new.data(), v_new.size() * 2, cudaMemcpyHostToDevice), "upload V new");
    cuda_ok(cudaMemcpy(seqlens_device.data, cache_seqlens.data(), batch * sizeof(int), cudaMemcpyHostToDevice), "upload lengths");
    cuda_ok(cudaMemcpy(table_device.data, block_table.data(), block_table.size() * sizeof(int), cudaMemcpyHostToDevice),
            "upload block table");

    // The decode problem: seqlen_k is the cache's capacity; the lengths are cache_seqlens.
    Problem decode_problem = problem;
    decode_problem.cu_seqlens_q.clear(), decode_problem.cu_seqlens_k.clear();
    decode_problem.seqlen_q = problem.varlen() ? problem.cu_seqlens_q[1] : problem.seqlen_q;
    decode_problem.seqlen_k = capacity;
    const auto with_batch_stride = [&](kernels::DeviceTensor tensor) {
      tensor.batch_stride = decode_problem.seqlen_q * tensor.row_stride;  // packed rows: equal query counts
      return tensor;
    };
    decode.q = with_batch_stride(args.q), decode.o = with_batch_stride(args.o), decode.lse = with_batch_stride(args.lse);
    const auto cache_tensor = [&](void* data) {
      kernels::DeviceTensor tensor;
      tensor.data = data, tensor.head_stride = head_dim, tensor.row_stride = row_elements;
      tensor.batch_stride = (paged ? layout.page_size : capacity) * row_elements;
      return tensor;
    };
    decode.k_cache = cache_tensor(k_device.data), decode.v_cache = cache_tensor(v_device.data);
    if (paged) {
      decode.block_table = static_cast<const int*>(table_device.data);
      decode.max_pages_per_sequence = pages_per_sequence, decode.num_pages = num_pages, decode.page_size = layout.page_size;
      decode.host_block_table = block_table.data();
    }
    decode.cache_seqlens = static_cast<const int*>(seqlens_device.data), decode.host_cache_seqlens = cache_seqlens.data();
    if (appended > 0) {
      decode.seqlen_new = appended;
      kernels::DeviceTensor k_new_tensor = cache_tensor(k_new_device.data), v_new_tensor = cache_tensor(v_new_device.data);
      k_new_tensor.batch_stride = v_new_tensor.batch_stride = appended * row_elements;
      decode.k_new = k_new_tensor, decode.v_new = v_new_tensor;
    }
    decode.num_splits = layout.num_splits;
    decode.stream = args.stream;
    kernels::decode_attention(decode_problem, decode);
    cuda_ok(cudaDeviceSynchronize(), "decode_attention");

    // The appended keys must now be in the cache, where the block table puts them.
    if (appended > 0) {
      std::vector<std::uint16_t> k_after(k_cache.size()), v_after(v_cache.size());
      cuda_ok(cudaMemcpy(k_after.data(), k_device.data, k_after.size() * 2, cudaMemcpyDeviceToHost), "download K cache");
      cuda_ok(cudaMemcpy(v_after.data(), v_device.data, v_after.size() * 2, cudaMemcpyDeviceToHost), "download V cache");
      for (int b = 0; b < batch; ++b) {
        for (int key = cache_seqlens[b]; key < lengths[b]; ++key) {
          const std::int64_t at = cache_row(b, key) * row_elements, source = (first_row[b] + key) * row_elements;
          if (!std::equal(k_rows.begin() + source, k_rows.begin() + source + row_elements, k_after.begin() + at) ||
              !std::equal(v_rows.begin() + source, v_rows.begin() + source + row_elements, v_after.begin() + at)) {
            throw reference::ImplementationFailure("appended key " + std::to_string(key) + " of sequence " +
                                                   std::to_string(b) + " is not in the cache where the block table puts it");
          }
        }
      }
    }
  });
}

Problem decode_problem(DType dtype, int tokens, int heads_kv, int group, int head_dim, const std::vector<int>& lengths,
                       bool causal) {
  Problem p;
  p.dtype = dtype, p.heads_kv = heads_kv, p.heads_q = heads_kv * group, p.head_dim = head_dim, p.mask.causal = causal;
  set_varlen(p, std::vector<int>(lengths.size(), tokens), lengths);
  return p;
}

void require_passed(const reference::CaseResult& result) {
  INFO(result.report);
  CHECK(result.status == reference::CaseResult::Status::passed);
}

}  // namespace

TEST_CASE("Decode kernel: query tokens x GQA groups x KV lengths, contiguous and paged", "[decode]") {
  const int tokens = GENERATE(1, 2, 4);
  const int group = GENERATE(1, 4, 8);
  const CacheLayout layout = GENERATE(CacheLayout{}, CacheLayout{16}, CacheLayout{64}, CacheLayout{256, 37, 0, 3});
  for (const bool causal : {false, true}) {
    // Three sequences: 127 keys, 1 key, and 2 blocks and a bit; the 1-key one is fully masked for
    // every token but the last when causal.
    const Problem problem = decode_problem(DType::bf16, tokens, 2, group, 128, {127, 1, 131}, causal);
    INFO("tokens " << tokens << ", group " << group << ", page size " << layout.page_size << ", causal " << causal);
    require_passed(reference::check_forward_case(decode_on_device(layout), problem));
  }
}

TEST_CASE("Decode kernel: 128k + 3 keys, split across the GPU, paged and contiguous", "[decode]") {
  const CacheLayout layout = GENERATE(CacheLayout{}, CacheLayout{16}, CacheLayout{256});
  const int tokens = GENERATE(1, 4);
  const Problem problem = decode_problem(DType::bf16, tokens, 2, 4, 128, {128 * 1024 + 3}, tokens > 1);
  reference::ForwardCheckOptions options;
  options.key_growth = 2.0;  // later chunks raise the rows' max: the combine's rescaling decides O
  INFO("tokens " << tokens << ", page size " << layout.page_size);
  require_passed(reference::check_forward_case(decode_on_device(layout), problem, options));
}

TEST_CASE("Decode kernel: head dims, fp16, 16 query tokens, MQA, appended tokens, forced splits", "[decode]") {
  struct Case {
    DType dtype;
    int tokens, heads_kv, group, head_dim;
    std::vector<int> lengths;
    CacheLayout layout;
  };
  const std::vector<Case> cases = {
      {DType::fp16, 1, 2, 4, 64, {700, 5}, {32}},
      {DType::bf16, 2, 1, 8, 256, {300, 1000}, {128, 37, 2}},
      {DType::bf16, 1, 2, 4, 96, {513}, {0, 37, 1, 5}},
      {DType::fp16, 16, 2, 2, 128, {40, 600}, {192, 37, 16}},      // 32 rows: two row tiles
      {DType::bf16, 3, 1, 16, 128, {2000, 17, 999}, {0, 37, 3, 7}},  // MQA, 48 rows, 7 chunks forced
      {DType::bf16, 4, 4, 1, 64, {64, 128, 65}, {16, 37, 4, 1}},   // one chunk forced
  };
  for (const Case& c : cases) {
    for (const bool causal : {false, true}) {
      const Problem problem = decode_problem(c.dtype, c.tokens, c.heads_kv, c.group, c.head_dim, c.lengths, causal);
      INFO("head_dim " << c.head_dim << ", tokens " << c.tokens << ", group " << c.group << ", page size "
                       << c.layout.page_size << ", appended " << c.layout.appended << ", splits " << c.layout.num_splits);
      require_passed(reference::check_forward_case(decode_on_device(c.layout), problem));
    }
  }
}

// A small grid for compute-sanitizer: a paged cache with an append, forced splits, causal tokens,
// several row tiles.
TEST_CASE("Decode kernel on a small grid (for the sanitizers)", "[sanitizer_grid_decode]") {
  const std::vector<std::pair<Problem, CacheLayout>> cases = {
      {decode_problem(DType::bf16, 4, 2, 4, 128, {300, 1, 70}, true), {16, 37, 2, 3}},
      {decode_problem(DType::fp16, 1, 1, 8, 64, {1000}, false), {0, 37, 1, 0}},
      {decode_problem(DType::bf16, 16, 1, 2, 256, {200, 40}, true), {64, 37, 0, 2}},
  };
  for (const auto& [problem, layout] : cases) require_passed(reference::check_forward_case(decode_on_device(layout), problem));
}
