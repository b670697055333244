#include "serving.hpp"

#include <iomanip>

#include "algorithms/checked_math.hpp"
#include "report.hpp"

namespace flashlab::sim {

ServingMetrics serving_metrics(const Problem& problem, const Counters& counters, const PagedKvCache& kv_cache) {
  problem.validate();
  kv_cache.validate();
  ServingMetrics m;
  m.generated_tokens = problem.total_rows_q();
  m.kv_cache_bytes = checked_product("bytes of the KV cache", problem.total_rows_k(), problem.heads_kv,
                                     problem.head_dim + problem.value_dim(), element_bytes(problem.dtype));
  m.kv_read_bytes = checked_add(counters[TensorId::K].hbm_read_bytes, counters[TensorId::V].hbm_read_bytes, "K, V bytes read");
  m.page_table_bytes = counters[TensorId::page_table].hbm_read_bytes;
  m.hbm_bytes = counters.hbm_bytes();
  const double tokens = static_cast<double>(m.generated_tokens);
  m.kv_bytes_per_token = static_cast<double>(m.kv_read_bytes) / tokens;
  m.hbm_bytes_per_token_per_layer = static_cast<double>(m.hbm_bytes) / tokens;
  m.kv_reads_per_cached_byte = static_cast<double>(m.kv_read_bytes) / static_cast<double>(m.kv_cache_bytes);
  m.page_size = kv_cache.page_size;
  if (kv_cache.paged()) m.page_reads = to_string(kv_cache.reads);
  return m;
}

nlohmann::json to_json(const ServingMetrics& m) {
  nlohmann::json json{{"generated_tokens", m.generated_tokens},
                      {"kv_cache_bytes", m.kv_cache_bytes},
                      {"kv_read_bytes", m.kv_read_bytes},
                      {"page_table_bytes", m.page_table_bytes},
                      {"hbm_bytes", m.hbm_bytes},
                      {"kv_bytes_per_token", m.kv_bytes_per_token},
                      {"hbm_bytes_per_token_per_layer", m.hbm_bytes_per_token_per_layer},
                      {"kv_reads_per_cached_byte", m.kv_reads_per_cached_byte},
                      {"page_size", m.page_size}};
  if (!m.page_reads.empty()) json["page_reads"] = m.page_reads;
  return json;
}

void print_serving(std::ostream& out, const ServingMetrics& m) {
  out << "KV cache        " << human_bytes(static_cast<double>(m.kv_cache_bytes)) << " (" << m.kv_cache_bytes << " B); read "
      << human_bytes(static_cast<double>(m.kv_read_bytes)) << " = " << std::setprecision(4) << m.kv_reads_per_cached_byte
      << " x the cache\n";
  out << "per token       " << m.generated_tokens << " generated: KV " << human_bytes(m.kv_bytes_per_token)
      << " / token, all HBM " << human_bytes(m.hbm_bytes_per_token_per_layer) << " / token / layer\n";
  out << "KV pages        ";
  if (m.page_size == 0) {
    out << "contiguous (no block table)\n";
  } else {
    out << m.page_size << " tokens, " << m.page_reads << "; block table read " << m.page_table_bytes << " B\n";
  }
}

}  // namespace flashlab::sim
