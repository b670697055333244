// Serving metrics of a decode run: what a serving engine reports per generated token.
//
// A run is one attention layer of one decoding step: every sequence of the batch generates
// seqlen_q tokens (1 for plain decoding, more for speculative or chunked steps), so the tokens
// generated are the query rows of the problem (batch x seqlen_q, or the sum of the varlen
// lengths). The KV cache is what the problem holds: every key row of every KV head, K and V in the
// problem's dtype (d + dv elements a token per KV head). The counted K, V reads divided by it say
// how often each cached byte crossed HBM (1: once, as GQA packing achieves; the group size
// without packing; more with whole-page reads).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "algorithms/paged_kv_cache.hpp"
#include "algorithms/problem.hpp"
#include "algorithms/tile_memory.hpp"

namespace flashlab::sim {

struct ServingMetrics {
  std::int64_t generated_tokens = 0;   // query rows of the problem: one generated token each
  std::int64_t kv_cache_bytes = 0;     // K and V of every sequence and KV head, each byte once
  std::int64_t kv_read_bytes = 0;      // K and V bytes the run read (with whole pages: their rest too)
  std::int64_t page_table_bytes = 0;   // block-table bytes the run read (paged caches)
  std::int64_t hbm_bytes = 0;          // every tensor, read and written
  double kv_bytes_per_token = 0;       // kv_read_bytes / generated_tokens
  double hbm_bytes_per_token_per_layer = 0;  // hbm_bytes / generated_tokens (a run is one layer)
  double kv_reads_per_cached_byte = 0;       // kv_read_bytes / kv_cache_bytes
  int page_size = 0;                   // 0: contiguous cache
  std::string page_reads;              // "valid_rows" or "whole_pages"; empty when contiguous
};

ServingMetrics serving_metrics(const Problem& problem, const Counters& counters, const PagedKvCache& kv_cache);

// {"generated_tokens", "kv_cache_bytes", "kv_read_bytes", "page_table_bytes", "hbm_bytes",
//  "kv_bytes_per_token", "hbm_bytes_per_token_per_layer", "kv_reads_per_cached_byte",
//  "page_size", "page_reads" (paged only)}: docs/schemas/run.schema.json, "serving".
nlohmann::json to_json(const ServingMetrics& metrics);
// Three lines of text for `flashlab run`.
void print_serving(std::ostream& out, const ServingMetrics& metrics);

}  // namespace flashlab::sim
