// Decoding as serving engines see it: a paged KV cache in split-KV decoding (page size, the
// block table's reads, what a key block reads of its pages) and the serving metrics of a run,
// held to counts derived by hand.
#include <string>

#include "catch.hpp"
#include "sim/closed_forms.hpp"
#include "sim/schedules.hpp"
#include "sim/serving.hpp"

using namespace flashlab;
using namespace flashlab::sim;

namespace {

// One decoding step of a GQA layer: 8 query heads on 2 KV heads (groups of 4), 1000 cached
// tokens, d = 64, fp16; 3 splits of ceil(1000 / 3) = 334 keys, key blocks of Bc keys.
Problem gqa_decode(int seqlen_q = 1) {
  Problem p;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = 1000;
  p.head_dim = 64;
  p.heads_q = 8;
  p.heads_kv = 2;
  p.dtype = DType::fp16;
  return p;
}

RunOptions paged(int page_size, PageReads reads, int block_cols, MemoryKind memory = MemoryKind::shape) {
  RunOptions options;
  options.memory = memory;
  options.blocks = {16, block_cols, 3};
  options.kv_cache.page_size = page_size;
  options.kv_cache.reads = reads;
  return options;
}

std::int64_t kv_read_bytes(const Counters& c) { return c[TensorId::K].hbm_read_bytes + c[TensorId::V].hbm_read_bytes; }

}  // namespace

TEST_CASE("a paged KV cache reads one block-table entry per page a key block touches, per KV head",
          "[sim][serving][paged]") {
  // Chunks [0, 334), [334, 668), [668, 1000); pages of 100 tokens; key blocks of 48 keys from each
  // chunk's start. Pages touched per block (floor(c0 / 100) .. floor((c0 + cols - 1) / 100)):
  //   chunk 0: [0,48) 1, [48,96) 1, [96,144) 2, [144,192) 1, [192,240) 2, [240,288) 1, [288,334) 2 = 10
  //   chunk 1: [334,382) 1, [382,430) 2, [430,478) 1, [478,526) 2, [526,574) 1, [574,622) 2, [622,668) 1 = 10
  //   chunk 2: [668,716) 2, [716,764) 1, [764,812) 2, [812,860) 1, [860,908) 2, [908,956) 1, [956,1000) 1 = 10
  // 30 int32 entries per KV head, 2 KV heads: 240 B in 42 loads (one per key block).
  const RunResult valid = run_schedule("split_kv", gqa_decode(), paged(100, PageReads::valid_rows, 48));
  CHECK(valid.counters[TensorId::page_table].hbm_read_elements == 60);
  CHECK(valid.counters[TensorId::page_table].hbm_read_bytes == 240);
  // valid_rows: K and V as a contiguous cache, each cached byte once: 2 x 1000 x 64 x 2 B each.
  CHECK(valid.counters[TensorId::K].hbm_read_bytes == 256000);
  CHECK(valid.counters[TensorId::V].hbm_read_bytes == 256000);
  const RunResult contiguous = run_schedule("split_kv", gqa_decode(), paged(0, PageReads::valid_rows, 48));
  CHECK(contiguous.counters[TensorId::page_table].hbm_read_bytes == 0);
  CHECK(kv_read_bytes(contiguous.counters) == kv_read_bytes(valid.counters));
  CHECK(valid.counters.loads == contiguous.counters.loads + 42);

  // whole_pages: every touched page in full, 30 x 100 = 3000 rows per KV head instead of 1000.
  const RunResult whole = run_schedule("split_kv", gqa_decode(), paged(100, PageReads::whole_pages, 48));
  CHECK(whole.counters[TensorId::page_table].hbm_read_bytes == 240);
  CHECK(whole.counters[TensorId::K].hbm_read_bytes == 2 * 3000 * 64 * 2);
  CHECK(whole.counters[TensorId::V].hbm_read_bytes == 2 * 3000 * 64 * 2);
  // Everything but K, V and the block table is the contiguous run's.
  for (TensorId id : {TensorId::Q, TensorId::O, TensorId::LSE, TensorId::O_partial, TensorId::LSE_partial})
    CHECK(whole.counters[id] == contiguous.counters[id]);
  CHECK(whole.counters.matmul_flops == contiguous.counters.matmul_flops);
}

TEST_CASE("whole-page reads pay for a split boundary inside a page, valid-row reads do not", "[sim][serving][paged]") {
  // Key blocks of one page (Bc = 100), but chunks of 334 keys: pages 3 and 6 are cut by a split
  // boundary. Per chunk: [0,100) [100,200) [200,300) [300,334): 4 entries; [334,434) [434,534)
  // [534,634): 2 each, [634,668): 1, 7 entries; [668,768) [768,868) [868,968): 2 each,
  // [968,1000): 1, 7 entries. 18 entries per KV head: whole pages read 1800 rows, 800 more than
  // the 1000 cached (pages 3 and 6 by both chunks, the rest of page 9 past the end is none: 1000
  // is a page boundary).
  const RunResult whole = run_schedule("split_kv", gqa_decode(), paged(100, PageReads::whole_pages, 100));
  CHECK(whole.counters[TensorId::page_table].hbm_read_elements == 2 * 18);
  CHECK(whole.counters[TensorId::K].hbm_read_elements == 2 * 1800 * 64);
  const RunResult valid = run_schedule("split_kv", gqa_decode(), paged(100, PageReads::valid_rows, 100));
  CHECK(valid.counters[TensorId::K].hbm_read_elements == 2 * 1000 * 64);
}

TEST_CASE("the paged closed form equals counted runs on odd sizes and masks, data and shape", "[sim][serving][paged]") {
  const int page_size = GENERATE(1, 7, 100, 1024);
  const PageReads reads = GENERATE(PageReads::valid_rows, PageReads::whole_pages);
  const bool causal = GENERATE(false, true);
  Problem problem = gqa_decode(3);  // three query rows: a speculative step
  problem.mask.causal = causal;
  problem.mask.window_left = causal ? 333 : -1;
  for (const MemoryKind memory : {MemoryKind::shape, MemoryKind::data}) {
    const RunOptions options = paged(page_size, reads, 48, memory);
    const RunResult result = run_schedule("split_kv", problem, options);
    INFO("page size " << page_size << ", " << to_string(reads) << (causal ? ", causal window" : "") << ", "
                      << to_string(memory));
    CHECK(closed_form("split_kv", problem, result.blocks, 0, options.kv_cache).tensor == result.counters.tensor);
    CHECK(closed_form("split_kv", problem, result.blocks, 0, options.kv_cache).loads == result.counters.loads);
  }
}

TEST_CASE("a varlen batch reads each sequence's own pages", "[sim][serving][paged]") {
  // Three sequences decoding one token each against 1000, 37 and 256 cached tokens; pages of 64,
  // whole-page reads, one split, key blocks of 64 from 0: each sequence reads ceil(len / 64)
  // pages in full (16 + 1 + 4 = 21) per KV head, 21 x 64 rows of K.
  Problem problem = gqa_decode();
  set_varlen(problem, {1, 1, 1}, {1000, 37, 256});
  RunOptions options = paged(64, PageReads::whole_pages, 64);
  options.blocks.num_splits = 1;
  const RunResult result = run_schedule("split_kv", problem, options);
  CHECK(result.counters[TensorId::page_table].hbm_read_elements == 2 * 21);
  CHECK(result.counters[TensorId::K].hbm_read_elements == 2 * 21 * 64 * 64);
  CHECK(closed_form("split_kv", problem, result.blocks, 0, options.kv_cache).tensor == result.counters.tensor);
  const ServingMetrics m = serving_metrics(problem, result.counters, options.kv_cache);
  CHECK(m.generated_tokens == 3);
  CHECK(m.kv_cache_bytes == (1000 + 37 + 256) * 2 * 128 * 2);
}

TEST_CASE("a paged cache changes no output: the block table only says where pages lie", "[sim][serving][paged]") {
  const PageReads reads = GENERATE(PageReads::valid_rows, PageReads::whole_pages);
  Problem problem = gqa_decode(2);
  problem.mask.causal = true;
  const RunResult contiguous = run_schedule("split_kv", problem, paged(0, reads, 48, MemoryKind::data));
  const RunResult pages = run_schedule("split_kv", problem, paged(64, reads, 48, MemoryKind::data));
  CHECK(pages.tensors.O.values == contiguous.tensors.O.values);
  CHECK(pages.tensors.LSE.values == contiguous.tensors.LSE.values);
}

TEST_CASE("serving metrics: KV bytes per generated token, the block table, HBM bytes per token per layer",
          "[sim][serving]") {
  // MQA decoding: 32 query heads on one KV head, a 32K-token cache, d = 128, bf16. The cache is
  // 32768 x (128 + 128) x 2 B = 16 777 216 B; packed heads read it once for the one token made.
  Problem problem;
  problem.seqlen_q = 1;
  problem.seqlen_k = 32768;
  problem.head_dim = 128;
  problem.heads_q = 32;
  problem.heads_kv = 1;
  problem.dtype = DType::bf16;
  RunOptions options;
  options.blocks = {16, 64, 8};  // 8 chunks of 4096 keys, 64 key blocks each: 512 blocks
  options.kv_cache.page_size = 16;
  const RunResult small_pages = run_schedule("split_kv", problem, options);
  const ServingMetrics m = serving_metrics(problem, small_pages.counters, options.kv_cache);
  CHECK(m.generated_tokens == 1);
  CHECK(m.kv_cache_bytes == 16777216);
  CHECK(m.kv_read_bytes == 16777216);
  CHECK(m.kv_bytes_per_token == 16777216.0);
  CHECK(m.kv_reads_per_cached_byte == 1.0);
  CHECK(m.page_table_bytes == 512 * 4 * 4);  // each 64-key block touches 4 pages of 16
  CHECK(m.hbm_bytes == small_pages.counters.hbm_bytes());
  CHECK(m.hbm_bytes_per_token_per_layer == static_cast<double>(small_pages.counters.hbm_bytes()));
  CHECK(m.page_reads == "valid_rows");

  // Pages of 256 read whole: each 64-key block reads its page of 256, 4x the cache; one entry a block.
  options.kv_cache = {256, PageReads::whole_pages};
  const ServingMetrics whole = serving_metrics(problem, run_schedule("split_kv", problem, options).counters, options.kv_cache);
  CHECK(whole.kv_reads_per_cached_byte == 4.0);
  CHECK(whole.page_table_bytes == 512 * 4);

  // A batch of 4 sequences makes 4 tokens: the per-token figures stay, the totals grow 4x.
  problem.batch = 4;
  options.kv_cache = {16, PageReads::valid_rows};
  const ServingMetrics batch = serving_metrics(problem, run_schedule("split_kv", problem, options).counters, options.kv_cache);
  CHECK(batch.generated_tokens == 4);
  CHECK(batch.kv_cache_bytes == 4 * 16777216LL);
  CHECK(batch.kv_bytes_per_token == 16777216.0);
}

TEST_CASE("paged KV cache options are refused outside their range and outside decoding", "[sim][serving][paged]") {
  using flashlab::testing::contains_text;
  RunOptions options = paged(-1, PageReads::valid_rows, 48);
  CHECK_THROWS_WITH(run_schedule("split_kv", gqa_decode(), options),
                    contains_text("page_size = -1") && contains_text("allowed: 1..65536"));
  options.kv_cache.page_size = 65537;
  CHECK_THROWS_WITH(run_schedule("split_kv", gqa_decode(), options), contains_text("page_size = 65537"));
  options.kv_cache.page_size = 16;
  CHECK_THROWS_WITH(run_schedule("fa2", gqa_decode(), options), contains_text("schedule 'fa2'") && contains_text("split_kv"));
  CHECK_THROWS_WITH(page_reads_from_string("some_rows"), contains_text("allowed: valid_rows, whole_pages"));
}
