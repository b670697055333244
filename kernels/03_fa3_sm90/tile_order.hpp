// The order in which the FA3 forward's grid walks its tiles (a query block of one head of one
// sequence), plain C++ shared by the kernel and the host (a CPU test checks it is a permutation).
//
// Tile t of the launch (or of a persistent block's walk) is mapped to (m_block, head, batch):
// - Without a causal mask every tile has the same work; neighbouring tiles are the query blocks of
//   one head, so the blocks resident at once read the same K and V and L2 serves the re-reads.
// - With a causal mask the last query blocks see the most keys, so the heaviest tiles go first
//   (longest-processing-time order: the grid's tail is made of the lightest tiles). Taken across
//   every head at once, though, the blocks resident together would each read a different head's
//   K and V, and every head's K and V would come from DRAM once per query block. So the
//   (head, batch) pairs are cut into sections whose K and V fit the L2 budget, and the heaviest-first
//   order runs within a section: sections one after another, query blocks from the last down,
//   the section's pairs inside.
#pragma once

#include "algorithms/host_device.hpp"
#include "kernels/common/constants.hpp"

namespace flashlab::kernels::fa3 {

struct TileCoordinates {
  int m_block, head, batch;
};

struct TileOrder {
  int m_blocks = 1;        // query blocks per sequence (of the longest for varlen)
  int heads_q = 1, batch = 1;
  int heaviest_first = 0;  // causal: heaviest first within each section
  int section_pairs = 1;   // (head, batch) pairs per section, >= 1
  int ascending = 0;       // sections: blocks from the first up (the backward's key blocks)

  FLASHLAB_HOST_DEVICE int tiles() const { return m_blocks * heads_q * batch; }

  FLASHLAB_HOST_DEVICE TileCoordinates coordinates(int tile) const {
    int m_block = 0, pair = 0;  // pair = batch * heads_q + head: adjacent heads share a GQA group's K and V
    if (heaviest_first) {
      const int pairs = heads_q * batch;
      const int section_tiles = section_pairs * m_blocks;
      const int section = tile / section_tiles, within = tile % section_tiles;
      const int first_pair = section * section_pairs;
      const int pairs_here = pairs - first_pair < section_pairs ? pairs - first_pair : section_pairs;
      m_block = ascending ? within / pairs_here : m_blocks - 1 - within / pairs_here;
      pair = first_pair + within % pairs_here;
    } else {
      m_block = tile % m_blocks;
      pair = tile / m_blocks;
    }
    return {m_block, pair % heads_q, pair / heads_q};
  }
};

// The (head, batch) pairs of one section: as many as the L2 budget holds the K and V of, where
// the group_size query heads of a GQA group share one K and V; at least one, at most all `pairs`
// (so that a section's tiles, pairs x m_blocks, never exceed the launch's).
inline int l2_section_pairs(long long seqlen_k, long long head_dim, int group_size, long long element_bytes,
                            long long l2_budget_bytes, int pairs) {
  const long long bytes_per_kv_head = 2 * seqlen_k * head_dim * element_bytes;  // K and V
  const long long kv_heads = l2_budget_bytes / (bytes_per_kv_head > 0 ? bytes_per_kv_head : 1);
  const long long fitting = kv_heads * group_size;
  return fitting < 1 ? 1 : (fitting > pairs ? pairs : static_cast<int>(fitting));
}

// The order fa3_forward launches (forward_host.cu): ceil(seqlen_q / block_m) query blocks of every
// (head, batch) pair; causal: heaviest first within sections of pairs whose K and V fit
// `l2_budget_bytes` (kL2SectionBytes; a larger budget makes fewer, larger sections, and one that
// holds every pair gives the order without sections, longest first across every head).
inline TileOrder forward_tile_order(int seqlen_q, int seqlen_k, int head_dim, int heads_q, int heads_kv, int batch,
                                    bool causal, int block_m, long long l2_budget_bytes = kL2SectionBytes) {
  TileOrder order;
  order.m_blocks = (seqlen_q + block_m - 1) / block_m;
  order.heads_q = heads_q, order.batch = batch;
  order.heaviest_first = causal ? 1 : 0;
  order.section_pairs = l2_section_pairs(seqlen_k, head_dim, heads_q / heads_kv, kElementBytes, l2_budget_bytes, heads_q * batch);
  return order;
}

// The order fa3_backward launches (backward_host.cu): the key blocks of every (KV head, batch)
// pair, in sections of pairs whose Q, dO (bf16/fp16) and fp32 dQ accumulator, group_size query
// heads each, fit `l2_budget_bytes`, the key blocks slowest within a section: from the first up
// (under a causal mask the first key blocks see the most queries: longest first), or in
// deterministic mode from the last down (its dQ turns go from the last key block down).
inline TileOrder backward_tile_order(int seqlen_q, int seqlen_k, int head_dim, int heads_q, int heads_kv, int batch,
                                     bool deterministic, int block_n, long long l2_budget_bytes = kL2SectionBytes) {
  TileOrder order;
  order.m_blocks = (seqlen_k + block_n - 1) / block_n;
  order.heads_q = heads_kv, order.batch = batch;  // the pairs are (KV head, batch)
  order.heaviest_first = 1;
  order.ascending = deterministic ? 0 : 1;
  const long long group_rows = static_cast<long long>(seqlen_q) * (heads_q / heads_kv);
  // l2_section_pairs counts 2 x element_bytes per row and column (K and V); Q, dO and the fp32
  // accumulator are 2 x element_bytes + 4.
  const long long pair_bytes_per_element = kElementBytes + 2;
  order.section_pairs = l2_section_pairs(group_rows, head_dim, 1, pair_bytes_per_element, l2_budget_bytes, heads_kv * batch);
  return order;
}

}  // namespace flashlab::kernels::fa3
