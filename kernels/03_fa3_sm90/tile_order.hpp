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
#include "kernels/common/fixed_divisor.hpp"

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
  // The divisions of coordinates() by multiply-high (fixed_divisor.hpp; a block works out its
  // tile before anything else, so the division's reciprocal sequence would delay its first loads):
  // by m_blocks, heads_q, a section's tiles, its pairs and the last section's pairs. Filled by
  // tile_order() below, which every order goes through.
  FixedDivisor by_m_blocks, by_heads, by_section_tiles, by_section_pairs, by_last_section_pairs;
  int last_section = 0;

  FLASHLAB_HOST_DEVICE int tiles() const { return m_blocks * heads_q * batch; }

  FLASHLAB_HOST_DEVICE TileCoordinates coordinates(int tile) const {
    int m_block = 0, pair = 0;  // pair = batch * heads_q + head: adjacent heads share a GQA group's K and V
    if (heaviest_first) {
      const int section = by_section_tiles.quotient(tile);
      const int within = by_section_tiles.remainder(tile, section);
      const FixedDivisor& by_pairs_here = section == last_section ? by_last_section_pairs : by_section_pairs;
      const int rank = by_pairs_here.quotient(within);
      m_block = ascending ? rank : m_blocks - 1 - rank;
      pair = section * section_pairs + by_pairs_here.remainder(within, rank);
    } else {
      pair = by_m_blocks.quotient(tile);
      m_block = by_m_blocks.remainder(tile, pair);
    }
    const int batch_index = by_heads.quotient(pair);
    return {m_block, by_heads.remainder(pair, batch_index), batch_index};
  }
};

// Every order: the fields, then the divisors worked out from them.
inline TileOrder tile_order(int m_blocks, int heads_q, int batch, int heaviest_first, int section_pairs, int ascending = 0) {
  TileOrder order;
  order.m_blocks = m_blocks, order.heads_q = heads_q, order.batch = batch;
  order.heaviest_first = heaviest_first, order.section_pairs = section_pairs, order.ascending = ascending;
  const int pairs = heads_q * batch;
  order.last_section = (pairs - 1) / section_pairs;
  order.by_m_blocks = FixedDivisor::of(m_blocks);
  order.by_heads = FixedDivisor::of(heads_q);
  order.by_section_tiles = FixedDivisor::of(section_pairs * m_blocks);
  order.by_section_pairs = FixedDivisor::of(section_pairs);
  order.by_last_section_pairs = FixedDivisor::of(pairs - order.last_section * section_pairs);
  return order;
}

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
  return tile_order((seqlen_q + block_m - 1) / block_m, heads_q, batch, causal ? 1 : 0,
                    l2_section_pairs(seqlen_k, head_dim, heads_q / heads_kv, kElementBytes, l2_budget_bytes, heads_q * batch));
}

// The order fa3_backward launches (backward_host.cu): the key blocks of every (KV head, batch)
// pair, from the first up, or in deterministic mode from the last down (its dQ turns go from the
// last key block down).
// - Under a causal mask the first key blocks see the most queries, so the longest go first: in
//   sections of pairs whose Q, dO (bf16/fp16) and fp32 dQ accumulator, group_size query heads
//   each, fit `l2_budget_bytes`, the key blocks slowest within a section.
// - Without one every key block has the same work: one pair a section, its key blocks one after
//   another (the plain grid order). The blocks resident together then share the fewest pairs' Q,
//   dO and accumulator, where sections of several pairs, the pairs fastest, spread each wave's
//   last blocks over a section's every pair (docs/fa3_backward_log.md, "The block order's DRAM
//   bytes").
// - In deterministic mode the sections stay at every mask: a pair's dQ turns pass from key block
//   to key block, and with the pairs fastest the blocks that start together hold the same turn of
//   different pairs, where one pair's key blocks started together wait for each other in turn
//   (the log's "The deterministic mode and the block order").
inline TileOrder backward_tile_order(int seqlen_q, int seqlen_k, int head_dim, int heads_q, int heads_kv, int batch,
                                     bool causal, bool deterministic, int block_n,
                                     long long l2_budget_bytes = kL2SectionBytes) {
  const long long group_rows = static_cast<long long>(seqlen_q) * (heads_q / heads_kv);
  // l2_section_pairs counts 2 x element_bytes per row and column (K and V); Q, dO and the fp32
  // accumulator are 2 x element_bytes + 4.
  const long long pair_bytes_per_element = kElementBytes + 2;
  // The pairs are (KV head, batch).
  const bool sections = causal || deterministic;
  const int section_pairs =
      sections ? l2_section_pairs(group_rows, head_dim, 1, pair_bytes_per_element, l2_budget_bytes, heads_kv * batch) : 1;
  return tile_order((seqlen_k + block_n - 1) / block_n, heads_kv, batch, 1, section_pairs, deterministic ? 0 : 1);
}

}  // namespace flashlab::kernels::fa3
