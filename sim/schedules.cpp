#include "schedules.hpp"

#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "algorithms/02_standard_attention.hpp"
#include "algorithms/03_fa1_forward.hpp"
#include "algorithms/04_fa2_forward.hpp"
#include "algorithms/05_standard_backward.hpp"
#include "algorithms/06_fa1_backward.hpp"
#include "algorithms/07_fa2_backward.hpp"
#include "algorithms/08_split_kv_decode.hpp"
#include "algorithms/09_block_sparse.hpp"
#include "algorithms/10_memory_efficient.hpp"
#include "algorithms/11_square_tiling.hpp"
#include "algorithms/12_ring_attention.hpp"
#include "algorithms/checked_math.hpp"
#include "algorithms/limits.hpp"
#include "algorithms/run_backward.hpp"
#include "algorithms/run_schedule.hpp"
#include "bounds.hpp"
#include "closed_forms.hpp"
#include "search.hpp"

namespace flashlab::sim {

const char* to_string(MemoryKind kind) { return kind == MemoryKind::data ? "data" : "shape"; }

MemoryKind memory_kind_from_string(const std::string& name) {
  if (name == "data") return MemoryKind::data;
  if (name == "shape") return MemoryKind::shape;
  throw std::invalid_argument("memory model '" + name + "' is unknown; allowed: data, shape");
}

const char* to_string(BlockRule rule) { return rule == BlockRule::paper ? "paper" : "fitting"; }

BlockRule block_rule_from_string(const std::string& name) {
  if (name == "fitting") return BlockRule::fitting;
  if (name == "paper") return BlockRule::paper;
  throw std::invalid_argument("block rule '" + name + "' is unknown; allowed: fitting, paper");
}

namespace {

using HeadCall = ScheduleInfo::HeadCall;

// The shapes of a tile side (the schedules' rules, algorithms/): FA1 line 1's, FA2's, square.
BlockSizes fa1_blocks_of_side(int side, int head_dim) {
  const BlockTiling t = fa1_tiling_of_side(side, head_dim);
  return {t.block_rows, t.block_cols};
}
BlockSizes fa2_blocks_of_side(int side, int head_dim) {
  const BlockTiling t = fa2_tiling_of_side(side, head_dim);
  return {t.block_rows, t.block_cols};
}
BlockSizes square_blocks_of_side(int side, int) { return {side, side}; }

// Builds an entry from a stateless generic lambda body(mem, call), instantiated for both models.
template <class Body>
ScheduleInfo entry(ScheduleInfo info, Body) {
  info.run_data = [](DataMemory& mem, const HeadCall& call) { Body{}(mem, call); };
  info.run_shape = [](ShapeMemory& mem, const HeadCall& call) { Body{}(mem, call); };
  return info;
}

std::vector<ScheduleInfo> make_registry() {
  std::vector<ScheduleInfo> list;
  list.push_back(entry({.name = "standard",
                        .source = "algorithms/02_standard_attention.hpp",
                        .paper = "FA1 Algorithm 0",
                        .description = "standard attention: S and P written to and read from HBM",
                        .pass = Pass::forward,
                        .tiled = false,
                        .paper_block_side = standard_attention_block_side,
                        .blocks_of_side = square_blocks_of_side,
                        .has_paper_block_rule = false,
                        .head_counts = oracle::standard_counts,
                        .working_set_bytes = [](const Problem& p, const BlockSizes& b) { return standard_attention_working_set_bytes(p, b.block_rows, b.block_cols); },
                        .tile_steps = oracle::block_pair_tile_steps,
                        .scratch_elements = oracle::standard_scratch,
                        .bound_formula = "N d + N^2",
                        .bound_source = "FA1 Theorem 2",
                        .bound = standard_bound,
                        .theory_exponents = standard_exponents,
                        .pseudocode = standard_attention_pseudocode,
                        .accumulator_elements = standard_accumulator_elements},
                       [](auto& mem, const HeadCall& call) {
                         standard_attention(mem, call.head, BlockTiling{call.blocks.block_rows, call.blocks.block_cols}, call.x);
                       }));
  list.push_back(entry({.name = "fa1",
                        .source = "algorithms/03_fa1_forward.hpp",
                        .paper = "FA1 Algorithm 1",
                        .description = "FlashAttention forward: K/V blocks outer, O, l, m re-read and re-written in HBM",
                        .pass = Pass::forward,
                        .paper_block_side = fa1_block_side,
                        .blocks_of_side = fa1_blocks_of_side,
                        .head_counts = oracle::fa1_counts,
                        .working_set_bytes = [](const Problem& p, const BlockSizes& b) { return fa1_working_set_bytes(p, b.block_rows, b.block_cols); },
                        .tile_steps = oracle::block_pair_tile_steps,
                        .scratch_elements = oracle::fa1_scratch,
                        .bound_formula = "N^2 d^2 / M",
                        .bound_source = "FA1 Theorem 2",
                        .bound = flash_bound,
                        .theory_exponents = flash_exponents,
                        .pseudocode = fa1_forward_pseudocode,
                        .accumulator_elements = forward_accumulator_elements},
                       [](auto& mem, const HeadCall& call) {
                         fa1_forward(mem, call.head, BlockTiling{call.blocks.block_rows, call.blocks.block_cols}, call.x);
                       }));
  list.push_back(entry({.name = "fa1_skip",
                        .source = "algorithms/09_block_sparse.hpp",
                        .paper = "FA1 Algorithm 1, hidden blocks skipped (Algorithm 5's loop)",
                        .description = "FlashAttention forward skipping the blocks a causal or window mask hides, "
                                       "as the project's FA1 kernel does (fa1 masks them, as the paper writes it)",
                        .pass = Pass::forward,
                        .paper_block_side = fa1_block_side,
                        .blocks_of_side = fa1_blocks_of_side,
                        .head_counts = oracle::fa1_skipping_counts,
                        .working_set_bytes = [](const Problem& p, const BlockSizes& b) { return fa1_working_set_bytes(p, b.block_rows, b.block_cols); },
                        .tile_steps = oracle::block_pair_tile_steps,
                        .scratch_elements = oracle::fa1_scratch,
                        .bound_formula = "N^2 d^2 / M",
                        .bound_source = "FA1 Theorem 2",
                        .bound = flash_bound,
                        .theory_exponents = flash_exponents,
                        .pseudocode = fa1_skipping_pseudocode,
                        .accumulator_elements = forward_accumulator_elements},
                       [](auto& mem, const HeadCall& call) {
                         fa1_forward_skipping(mem, call.head, BlockTiling{call.blocks.block_rows, call.blocks.block_cols}, call.x);
                       }));
  list.push_back(entry({.name = "fa2",
                        .source = "algorithms/04_fa2_forward.hpp",
                        .paper = "FA2 Algorithm 1",
                        .description = "FlashAttention-2 forward: query blocks outer, O and (m, l) on chip",
                        .pass = Pass::forward,
                        .paper_block_side = fa1_block_side,
                        .blocks_of_side = fa2_blocks_of_side,
                        .head_counts = oracle::fa2_counts,
                        .working_set_bytes = [](const Problem& p, const BlockSizes& b) { return fa2_working_set_bytes(p, b.block_rows, b.block_cols); },
                        .tile_steps = oracle::block_pair_tile_steps,
                        .scratch_elements = oracle::no_scratch,
                        .bound_formula = "N^2 d^2 / M",
                        .bound_source = "FA1 Theorem 2",
                        .bound = flash_bound,
                        .theory_exponents = flash_exponents,
                        .pseudocode = fa2_forward_pseudocode,
                        .accumulator_elements = forward_accumulator_elements,
                        .parallel_loop = {3, 16, 4, 14}},
                       [](auto& mem, const HeadCall& call) {
                         fa2_forward(mem, call.head, BlockTiling{call.blocks.block_rows, call.blocks.block_cols}, call.x);
                       }));
  list.push_back(entry({.name = "standard_backward",
                        .source = "algorithms/05_standard_backward.hpp",
                        .paper = "FA1 Algorithm 3",
                        .description = "standard backward: P read from HBM, dP and dS written to and read from HBM",
                        .pass = Pass::backward,
                        .tiled = false,
                        .paper_block_side = standard_attention_block_side,
                        .blocks_of_side = square_blocks_of_side,
                        .has_paper_block_rule = false,
                        .head_counts = oracle::standard_backward_counts,
                        .working_set_bytes = [](const Problem& p, const BlockSizes& b) { return standard_backward_working_set_bytes(p, b.block_rows, b.block_cols); },
                        .tile_steps = oracle::block_pair_tile_steps,
                        .scratch_elements = oracle::standard_backward_scratch,
                        .bound_formula = "N d + N^2",
                        .bound_source = "FA1 Theorem 5",
                        .bound = standard_bound,
                        .theory_exponents = standard_exponents,
                        .pseudocode = standard_backward_pseudocode,
                        .accumulator_elements = standard_accumulator_elements},
                       [](auto& mem, const HeadCall& call) {
                         // The residual pass (P as Algorithm 0 left it) is counted apart, not here.
                         standard_backward_from_lse(mem, call.head,
                                                    BlockTiling{call.blocks.block_rows, call.blocks.block_cols}, call.x);
                       }));
  list.push_back(entry({.name = "fa1_backward",
                        .source = "algorithms/06_fa1_backward.hpp",
                        .paper = "FA1 Algorithm 4",
                        .description = "FlashAttention backward: K/V blocks outer, P recomputed, dQ read-modify-write",
                        .pass = Pass::backward,
                        .paper_block_side = fa1_block_side,
                        .blocks_of_side = fa1_blocks_of_side,
                        .head_counts = oracle::fa1_backward_counts,
                        .working_set_bytes = [](const Problem& p, const BlockSizes& b) { return fa1_backward_working_set_bytes(p, b.block_rows, b.block_cols); },
                        .tile_steps = oracle::block_pair_tile_steps,
                        .scratch_elements = oracle::fa1_backward_scratch,
                        .bound_formula = "N^2 d^2 / M",
                        .bound_source = "FA1 Theorem 5",
                        .bound = flash_bound,
                        .theory_exponents = flash_exponents,
                        .pseudocode = fa1_backward_pseudocode,
                        .accumulator_elements = backward_accumulator_elements},
                       [](auto& mem, const HeadCall& call) {
                         fa1_backward_from_lse(mem, call.head, BlockTiling{call.blocks.block_rows, call.blocks.block_cols},
                                               call.x);
                       }));
  list.push_back(entry({.name = "fa2_backward",
                        .source = "algorithms/07_fa2_backward.hpp",
                        .paper = "FA2 Algorithm 2",
                        .description = "FlashAttention-2 backward: D precomputed, masked blocks skipped, P from LSE, "
                                       "dQ read-modify-write in HBM as the paper writes it",
                        .pass = Pass::backward,
                        .paper_block_side = fa1_block_side,
                        .blocks_of_side = fa1_blocks_of_side,
                        .head_counts = oracle::fa2_backward_counts,
                        .working_set_bytes = [](const Problem& p, const BlockSizes& b) { return fa2_backward_working_set_bytes(p, b.block_rows, b.block_cols); },
                        .tile_steps = oracle::block_pair_tile_steps,
                        .scratch_elements = oracle::fa2_backward_scratch,
                        .bound_formula = "N^2 d^2 / M",
                        .bound_source = "FA1 Theorem 5",
                        .bound = flash_bound,
                        .theory_exponents = flash_exponents,
                        .pseudocode = fa2_backward_pseudocode,
                        .accumulator_elements = backward_accumulator_elements,
                        .parallel_loop = {5, 19, 6, 18}},
                       [](auto& mem, const HeadCall& call) {
                         fa2_backward(mem, call.head, BlockTiling{call.blocks.block_rows, call.blocks.block_cols}, call.x);
                       }));
  list.push_back(entry({.name = "fa2_backward_atomic",
                        .source = "algorithms/07_fa2_backward.hpp",
                        .paper = "FA2 Algorithm 2, line 15 with atomic adds",
                        .description = "FlashAttention-2 backward, dQ added with atomics at L2 (never read), "
                                       "as the project's FA2 kernel does (fa2_backward: read-modify-write in HBM)",
                        .pass = Pass::backward,
                        .paper_block_side = fa1_block_side,
                        .blocks_of_side = fa1_blocks_of_side,
                        .head_counts = oracle::fa2_backward_atomic_counts,
                        .working_set_bytes = [](const Problem& p, const BlockSizes& b) { return fa2_backward_working_set_bytes(p, b.block_rows, b.block_cols); },
                        .tile_steps = oracle::block_pair_tile_steps,
                        .scratch_elements = oracle::fa2_backward_scratch,
                        .bound_formula = "N^2 d^2 / M",
                        .bound_source = "FA1 Theorem 5",
                        .bound = flash_bound,
                        .theory_exponents = flash_exponents,
                        .pseudocode = fa2_backward_atomic_pseudocode,
                        .accumulator_elements = backward_accumulator_elements,
                        .parallel_loop = {5, 19, 6, 18}},
                       [](auto& mem, const HeadCall& call) {
                         fa2_backward(mem, call.head, BlockTiling{call.blocks.block_rows, call.blocks.block_cols}, call.x,
                                      DqUpdate::atomic);
                       }));
  list.push_back(entry({.name = "split_kv",
                        .source = "algorithms/08_split_kv_decode.hpp",
                        .paper = "Flash-Decoding",
                        .description = "split-KV decoding: partial O and LSE per KV chunk, then the log-sum-exp combine; "
                                       "GQA/MQA heads packed (K, V read once per KV head)",
                        .pass = Pass::decode,
                        .shares_kv_in_group = true,
                        .key_block_count_decides = false,
                        .paper_block_side = fa1_block_side,
                        .blocks_of_side = fa2_blocks_of_side,
                        .head_counts = oracle::split_kv_counts,
                        .kv_head_counts = oracle::split_kv_kv_head_counts,
                        .working_set_bytes = [](const Problem& p, const BlockSizes& b) { return split_kv_working_set_bytes(p, b.block_rows, b.block_cols, b.num_splits); },
                        .tile_steps = oracle::split_kv_tile_steps,
                        .scratch_elements = oracle::split_kv_scratch,
                        .bound_formula = "N^2 d^2 / M",
                        .bound_source = "FA1 Theorem 2",
                        .bound = flash_bound,
                        .theory_exponents = flash_exponents,
                        .pseudocode = split_kv_pseudocode,
                        .accumulator_elements = forward_accumulator_elements},
                       [](auto& mem, const HeadCall& call) {
                         SplitKvTiling tiling;
                         tiling.block_rows = call.blocks.block_rows;
                         tiling.block_cols = call.blocks.block_cols;
                         tiling.num_splits = call.blocks.num_splits > 0 ? call.blocks.num_splits : tiling.num_splits;
                         split_kv_forward_group(mem, call.group_heads, tiling, call.group_x, call.kv_cache);
                       }));
  list.push_back(entry({.name = "block_sparse",
                        .source = "algorithms/09_block_sparse.hpp",
                        .paper = "FA1 Algorithm 5",
                        .description = "block-sparse FlashAttention: only blocks with a visible score are loaded and computed",
                        .pass = Pass::forward,
                        .paper_block_side = fa1_block_side,
                        .blocks_of_side = fa1_blocks_of_side,
                        .head_counts = oracle::fa1_skipping_counts,
                        .working_set_bytes = [](const Problem& p, const BlockSizes& b) { return fa1_working_set_bytes(p, b.block_rows, b.block_cols); },
                        .tile_steps = oracle::block_pair_tile_steps,
                        .scratch_elements = oracle::fa1_scratch,
                        .bound_formula = "N d + N^2 d^2 s / M",
                        .bound_source = "FA1 Proposition 4",
                        .bound = block_sparse_bound,
                        .theory_exponents = flash_exponents,
                        .pseudocode = block_sparse_pseudocode,
                        .accumulator_elements = forward_accumulator_elements},
                       [](auto& mem, const HeadCall& call) {
                         fa1_block_sparse_forward(mem, call.head, BlockTiling{call.blocks.block_rows, call.blocks.block_cols}, call.x);
                       }));
  list.push_back(entry({.name = "memory_efficient",
                        .source = "algorithms/10_memory_efficient.hpp",
                        .paper = "Rabe and Staats 2021",
                        .description = "memory-efficient attention: chunk summaries written to HBM, combined per query chunk",
                        .pass = Pass::forward,
                        .paper_block_side = memory_efficient_block_side,
                        .blocks_of_side = square_blocks_of_side,
                        .has_paper_block_rule = false,
                        .head_counts = oracle::memory_efficient_counts,
                        .working_set_bytes = [](const Problem& p, const BlockSizes& b) { return memory_efficient_working_set_bytes(p, b.block_rows, b.block_cols); },
                        .tile_steps = oracle::block_pair_tile_steps,
                        .scratch_elements = oracle::memory_efficient_scratch,
                        .bound_formula = "N^2 d / min(sqrt(M), M / d)",
                        .bound_source = "square chunks (this simulator)",
                        .bound = memory_efficient_bound,
                        .theory_exponents = memory_efficient_exponents,
                        .pseudocode = memory_efficient_pseudocode,
                        .accumulator_elements = forward_accumulator_elements},
                       [](auto& mem, const HeadCall& call) {
                         memory_efficient_attention(mem, call.head,
                                                    BlockTiling{call.blocks.block_rows, call.blocks.block_cols}, call.x);
                       }));
  list.push_back(entry({.name = "square_tiling",
                        .source = "algorithms/11_square_tiling.hpp",
                        .paper = "Saha and Ye 2024, Algorithm 1",
                        .description = "square tiling for small SRAM: A = exp(QK^T) in HBM, then A V by B x B tiles",
                        .pass = Pass::forward,
                        .one_sided = true,
                        .paper_block_side = [](std::int64_t m, std::int64_t) { return SquareTiling::side_of(m); },
                        .blocks_of_side = square_blocks_of_side,
                        .head_counts = oracle::square_tiling_counts,
                        .working_set_bytes = [](const Problem& p, const BlockSizes& b) { return square_tiling_working_set_bytes(p, b.block_rows); },
                        .tile_steps = oracle::square_tiling_tile_steps,
                        .scratch_elements = oracle::square_tiling_scratch,
                        .bound_formula = "N^2 d / sqrt(M) + N^2",
                        .bound_source = "Saha and Ye, Algorithm 1",
                        .bound = square_tiling_bound,
                        .theory_exponents = square_tiling_exponents,
                        .pseudocode = square_tiling_pseudocode,
                        .accumulator_elements = square_tiling_accumulator_elements},
                       [](auto& mem, const HeadCall& call) {
                         square_tiling_attention(mem, call.head, SquareTiling{call.blocks.block_rows}, call.x);
                       }));
  list.push_back(entry({.name = "ring",
                        .source = "algorithms/12_ring_attention.hpp",
                        .paper = "Ring Attention, Algorithm 1",
                        .description = "ring attention over P devices (--devices, --ordering contiguous|striped|zigzag): "
                                       "query shards in place, K/V blocks around the ring, FA2 per block pair, LSE merge "
                                       "(Liu, Zaharia and Abbeel 2023, Algorithm 1)",
                        .pass = Pass::forward,
                        .shares_kv_in_group = true,
                        .key_block_count_decides = false,
                        .splits_over_devices = true,
                        .unsupported = ring_unsupported,
                        .paper_block_side = fa1_block_side,
                        .blocks_of_side = fa2_blocks_of_side,
                        .head_counts = oracle::ring_counts,
                        .kv_head_counts = oracle::ring_kv_head_counts,
                        .working_set_bytes = [](const Problem& p, const BlockSizes& b) { return ring_working_set_bytes(p, ring_tiling(b)); },
                        .tile_steps = oracle::ring_tile_steps,
                        .scratch_elements = oracle::ring_scratch,
                        .bound_formula = "N^2 d^2 / M",
                        .bound_source = "FA1 Theorem 2 (every device runs FA2)",
                        .bound = flash_bound,
                        .theory_exponents = flash_exponents,
                        .pseudocode = ring_attention_pseudocode,
                        .accumulator_elements = forward_accumulator_elements},
                       [](auto& mem, const HeadCall& call) {
                         ring_forward([&mem](int) -> decltype(mem) { return mem; }, call.group_heads, ring_tiling(call.blocks),
                                      call.group_x);
                       }));
  list.push_back(entry({.name = "ring_backward",
                        .source = "algorithms/12_ring_attention.hpp",
                        .paper = "Ring Attention, backward",
                        .description = "ring attention's backward over P devices: FA2's backward per block pair, dQ "
                                       "accumulated in place, dK and dV accumulated as they travel the ring",
                        .pass = Pass::backward,
                        .shares_kv_in_group = true,
                        .key_block_count_decides = false,
                        .splits_over_devices = true,
                        .unsupported = ring_unsupported,
                        .paper_block_side = fa1_block_side,
                        .blocks_of_side = fa1_blocks_of_side,
                        .head_counts = oracle::ring_backward_counts,
                        .kv_head_counts = oracle::ring_backward_kv_head_counts,
                        .working_set_bytes = [](const Problem& p, const BlockSizes& b) { return ring_backward_working_set_bytes(p, ring_tiling(b)); },
                        .tile_steps = oracle::ring_tile_steps,
                        .scratch_elements = oracle::ring_backward_scratch,
                        .bound_formula = "N^2 d^2 / M",
                        .bound_source = "FA1 Theorem 5 (every device runs FA2's backward)",
                        .bound = flash_bound,
                        .theory_exponents = flash_exponents,
                        .pseudocode = ring_attention_backward_pseudocode,
                        .accumulator_elements = backward_accumulator_elements},
                       [](auto& mem, const HeadCall& call) {
                         ring_backward([&mem](int) -> decltype(mem) { return mem; }, call.group_heads, ring_tiling(call.blocks),
                                       call.group_x);
                       }));
  return list;
}

// One memory model for the heads of one call: a single head, or a KV group of a schedule that
// shares K and V across it.
template <class Memory>
Counters run_heads(const ScheduleInfo& info, std::span<const HeadProblem> heads, const BlockSizes& blocks,
                   std::span<const HeadTensors> xs, const Problem& problem, const RunOptions& options) {
  Memory mem(MemoryConfig{problem.dtype, options.sram_bytes}, options.trace);
  const HeadCall call{heads.front(), blocks, xs.front(), Memory::with_data, heads, xs, options.kv_cache};
  if constexpr (Memory::with_data) {
    info.run_data(mem, call);
  } else {
    info.run_shape(mem, call);
  }
  return mem.counters();
}

template <class Memory>
Counters run_one_head(const ScheduleInfo& info, const HeadProblem& head, const BlockSizes& blocks,
                      const HeadTensors& x, const Problem& problem, const RunOptions& options) {
  return run_heads<Memory>(info, std::span<const HeadProblem>(&head, 1), blocks, std::span<const HeadTensors>(&x, 1), problem,
                           options);
}

// Backward passes read O and LSE of the forward pass: computed here by the FA2 forward, not
// counted.
void prepare_forward_outputs(const Problem& problem, AttentionTensors& tensors) {
  run_per_head<DataMemory>(problem, tensors, 0, [](DataMemory& mem, const HeadProblem& head, const HeadTensors& x) {
    fa2_forward(mem, head, BlockTiling{64, 64}, x);
  });
}

BlockSizes resolve_blocks_as_given(const ScheduleInfo& info, const Problem& problem, const RunOptions& options);

// The block sizes a run uses; a ring's carry its devices (0 given: 4) and ordering.
BlockSizes resolve_blocks(const ScheduleInfo& info, const Problem& problem, const RunOptions& options) {
  BlockSizes blocks = resolve_blocks_as_given(info, problem, options);
  if (info.splits_over_devices) blocks.devices = ring_tiling(blocks).devices;
  return blocks;
}

BlockSizes resolve_blocks_as_given(const ScheduleInfo& info, const Problem& problem, const RunOptions& options) {
  if (options.sram_bytes < 0 || options.sram_bytes > kMaxSramBytes) {
    throw std::invalid_argument("sram_bytes = " + std::to_string(options.sram_bytes) + "; allowed: 0.." +
                                std::to_string(kMaxSramBytes) + " (0: unbounded)");
  }
  if (options.blocks.num_splits < 0 || options.blocks.num_splits > kMaxSequenceLength) {
    throw std::invalid_argument("num_splits = " + std::to_string(options.blocks.num_splits) + "; allowed: 1.." +
                                std::to_string(kMaxSequenceLength) + " (0: 4)");
  }
  options.kv_cache.validate();
  if (options.blocks.devices != 0 || options.blocks.ordering != RingOrdering::zigzag) {
    if (!info.splits_over_devices)
      throw std::invalid_argument("schedule '" + info.name + "': devices " + std::to_string(options.blocks.devices) +
                                  ", ordering " + to_string(options.blocks.ordering) +
                                  " are a ring's; allowed: ring, ring_backward, or neither given");
    if (options.blocks.devices < 0 || options.blocks.devices > kMaxRingDevices)
      throw std::invalid_argument("devices = " + std::to_string(options.blocks.devices) + "; allowed: 1.." +
                                  std::to_string(kMaxRingDevices) + " (0: 4)");
  }
  if (options.kv_cache.paged() && info.pass != Pass::decode) {
    throw std::invalid_argument("schedule '" + info.name + "': a paged KV cache (page_size " +
                                std::to_string(options.kv_cache.page_size) +
                                ") is modelled for the decode schedule only; allowed: split_kv, or page_size 0");
  }
  if (options.blocks.given()) {
    const auto in_range = [](int size) { return size >= 1 && size <= kMaxSequenceLength; };
    if (!in_range(options.blocks.block_rows) || !in_range(options.blocks.block_cols)) {
      throw std::invalid_argument("block sizes " + std::to_string(options.blocks.block_rows) + " x " +
                                  std::to_string(options.blocks.block_cols) + "; allowed: both in 1.." +
                                  std::to_string(kMaxSequenceLength));
    }
    return options.blocks;
  }
  if (options.sram_bytes == 0) {
    throw std::invalid_argument("schedule '" + info.name + "': neither block sizes nor an SRAM size M given; allowed: M >= 1 byte or explicit block sizes");
  }
  BlockSizes derived = derive_blocks(info.name, problem, options.sram_bytes, options.block_rule);
  derived.num_splits = options.blocks.num_splits;  // split_kv: a split count may come with derived blocks
  derived.devices = options.blocks.devices;        // ring: the devices and ordering too
  derived.ordering = options.blocks.ordering;
  return derived;
}

// The forward heads of a problem, or for backward passes the KV-head groups (run_backward.hpp:
// with GQA/MQA each query head writes its dK, dV into an fp32 buffer and the group is summed in
// head order): the units of a run. Data runs execute every unit; shape runs one unit per class
// of units that must count the same (sequence lengths; ALiBi on or off per head), multiplied by
// the class size. Classes are found from the sequences and the heads apart, so finding them
// costs O(batch + heads), and a dense batch's sequences are all alike (O(heads)).
struct UnitClass {
  int b = 0, first_head = 0;  // the unit that is run
  std::int64_t count = 0;     // the units it stands for
};

std::vector<UnitClass> unit_classes(const Problem& problem, int unit_heads) {
  std::map<std::pair<int, int>, UnitClass> lengths;  // (seqlen_q, seqlen_k) -> its first sequence, count
  const int sequences = problem.varlen() ? problem.batch : 1;
  const std::int64_t copies = problem.varlen() ? 1 : problem.batch;
  for (int b = 0; b < sequences; ++b) {
    auto [it, inserted] = lengths.try_emplace({problem.seqlen_q_of(b), problem.seqlen_k_of(b)}, UnitClass{b, 0, 0});
    it->second.count += copies;
  }
  std::map<std::vector<bool>, UnitClass> alibi;  // ALiBi on or off per head of a unit -> its first unit, count
  for (int first = 0; first < problem.heads_q; first += unit_heads) {
    std::vector<bool> pattern;
    for (int h = first; h < first + unit_heads; ++h) {
      pattern.push_back(!problem.alibi_slopes.empty() && problem.alibi_slopes[h] != 0.0f);
    }
    auto [it, inserted] = alibi.try_emplace(std::move(pattern), UnitClass{0, first, 0});
    ++it->second.count;
  }
  std::vector<UnitClass> classes;
  for (const auto& [key, sequence] : lengths) {
    for (const auto& [pattern, unit] : alibi) {
      classes.push_back({sequence.b, unit.first_head, checked_mul(sequence.count, unit.count, "units of a class")});
    }
  }
  return classes;
}

std::string describe(const ScheduleInfo& info, const Problem& problem, MemoryKind memory) {
  std::ostringstream text;
  text << info.name << " (" << to_string(memory) << " run) on batch " << problem.batch << ", heads " << problem.heads_q << "/"
       << problem.heads_kv << ", N " << problem.seqlen_q << " x " << problem.seqlen_k << ", d " << problem.head_dim << "/"
       << problem.value_dim();
  return text.str();
}

[[noreturn]] void refuse_cost(const ScheduleInfo& info, const Problem& problem, MemoryKind memory, const char* quantity,
                              std::int64_t value, std::int64_t limit, const char* advice) {
  const bool saturated = value == std::numeric_limits<std::int64_t>::max();
  throw std::invalid_argument(describe(info, problem, memory) + ": " + quantity + (saturated ? " > " : " = ") +
                              std::to_string(value) + "; allowed: at most " + std::to_string(limit) + " (" + advice + ")");
}

// An upper bound held to a limit: past int64 it is only "past the limit", so it saturates.
template <class Bound>
std::int64_t saturated(Bound bound) {
  try {
    return bound().value();
  } catch (const SizeOverflow&) {
    return std::numeric_limits<std::int64_t>::max();
  }
}

// The query heads of one unit of a run: one, or a KV head's group for backward passes (the dK,
// dV reduction) and for schedules that share K and V across the group.
int unit_heads_of(const ScheduleInfo& info, const Problem& problem) {
  return info.pass == Pass::backward || info.shares_kv_in_group ? problem.group_size() : 1;
}

RunCost cost_of(const ScheduleInfo& info, const Problem& problem, const RunOptions& options, const BlockSizes& blocks,
                bool caller_tensors) {
  using Count = CheckedInt64;
  const bool backward = info.pass == Pass::backward;
  const int unit_heads = unit_heads_of(info, problem);
  RunCost cost;
  if (options.memory == MemoryKind::shape && !options.every_head) {
    const std::vector<UnitClass> classes = unit_classes(problem, unit_heads);
    cost.tile_steps = saturated([&] {
      Count steps = 0;
      for (const UnitClass& unit : classes) steps += Count(tile_steps(info.name, problem, unit.b, blocks)) * unit_heads;
      return steps;
    });
    return cost;
  }
  // Every unit is run: the cost of each sequence times its heads (a dense batch's sequences alike).
  const int sequences = problem.varlen() ? problem.batch : 1;
  const Count copies = problem.varlen() ? 1 : problem.batch;
  const Count d = problem.head_dim, dv = problem.value_dim();
  cost.tile_steps = saturated([&] {
    Count steps = 0;
    for (int b = 0; b < sequences; ++b) steps += Count(tile_steps(info.name, problem, b, blocks)) * problem.heads_q * copies;
    return steps;
  });
  if (options.memory == MemoryKind::shape) return cost;
  cost.multiply_adds = saturated([&] {
    const Count per_score = backward ? 4 * d + 3 * dv : d + dv;  // a backward pass runs its forward pass too
    Count multiply_adds = 0;
    for (int b = 0; b < sequences; ++b) {
      multiply_adds += Count(problem.seqlen_q_of(b)) * problem.seqlen_k_of(b) * per_score * problem.heads_q * copies;
    }
    return multiply_adds;
  });
  cost.data_bytes = saturated([&] {
    constexpr std::int64_t kHostFloat = sizeof(float);  // host tensors and tiles hold fp32 values
    const Count rows_q = problem.total_rows_q(), rows_k = problem.total_rows_k();
    Count tensors = rows_q * problem.heads_q * (d + dv + 1) + rows_k * problem.heads_kv * (d + dv);  // Q, O, LSE; K, V
    if (backward) tensors += rows_q * problem.heads_q * (d + dv) + rows_k * problem.heads_kv * (d + dv);  // dQ, dO; dK, dV
    Count scratch = 0;  // per head, freed after it: the largest sequence's
    for (int b = 0; b < sequences; ++b) {
      Count head_scratch = scratch_elements(info.name, problem, b, blocks);
      if (info.shares_kv_in_group) head_scratch = head_scratch * unit_heads;  // the group's partials at once
      if (backward && unit_heads > 1) {  // the group's fp32 dK, dV parts
        head_scratch += Count(unit_heads) * problem.seqlen_k_of(b) * (d + dv);
      }
      scratch = std::max(scratch, head_scratch);
    }
    // SRAM tiles: at most the working set, and never more than M; tiles of 2-byte types are fp32 here.
    Count tiles = working_set_bytes(info.name, problem, blocks);
    if (options.sram_bytes > 0) tiles = std::min(tiles, Count(options.sram_bytes));
    tiles = tiles * (kHostFloat / element_bytes(problem.dtype));
    return (caller_tensors ? Count(0) : tensors * kHostFloat) + scratch * kHostFloat + tiles;
  });
  return cost;
}

void require_within_limits(const ScheduleInfo& info, const Problem& problem, const RunOptions& options, const RunCost& cost) {
  constexpr const char* kDataAdvice = "count it shape-only, without data, or run a smaller problem";
  if (options.memory == MemoryKind::data) {
    if (cost.data_bytes > kMaxDataBytes) {
      refuse_cost(info, problem, options.memory, "host memory in bytes", cost.data_bytes, kMaxDataBytes, kDataAdvice);
    }
    if (cost.multiply_adds > kMaxDataMultiplyAdds) {
      refuse_cost(info, problem, options.memory, "multiply-adds", cost.multiply_adds, kMaxDataMultiplyAdds, kDataAdvice);
    }
  }
  if (cost.tile_steps > kMaxTileSteps) {
    refuse_cost(info, problem, options.memory, "tile steps", cost.tile_steps, kMaxTileSteps,
                "larger blocks or SRAM, or a shorter sequence");
  }
}

template <class Memory>
Counters run_unit(const ScheduleInfo& info, const Problem& problem, const RunOptions& options, const BlockSizes& blocks,
                  AttentionTensors* tensors, int b, int first_head, int heads, std::int64_t& heads_run) {
  const bool backward = info.pass == Pass::backward;
  auto views = [&](int h) {
    if constexpr (Memory::with_data) return head_tensors(*tensors, problem, b, h);
    return shape_only_head_tensors(problem, b);  // run_backward.hpp: shapes, no data
  };
  if (info.shares_kv_in_group) {  // the whole group in one call, on one memory model
    std::vector<HeadProblem> group_heads;
    std::vector<HeadTensors> group_x;
    for (int h = first_head; h < first_head + heads; ++h) {
      group_heads.push_back(head_problem(problem, b, h));
      group_x.push_back(views(h));
    }
    heads_run += heads;
    return run_heads<Memory>(info, group_heads, blocks, group_x, problem, options);
  }
  // One head or a KV group's heads one by one, dK and dV routed by the one group runner
  // (algorithms/run_backward.hpp: run_head_group).
  const auto with_memory = [&](auto&& f) {
    Memory mem(MemoryConfig{problem.dtype, options.sram_bytes}, options.trace);
    f(mem);
    return mem.counters();
  };
  const auto run_head = [&](const HeadProblem& head, const HeadTensors& x) {
    ++heads_run;
    return run_one_head<Memory>(info, head, blocks, x, problem, options);
  };
  return run_head_group<Memory>(problem, b, first_head, heads, backward, options.group_reduction, options.sram_bytes, views,
                                run_head, with_memory);
}

RunResult run_impl(const ScheduleInfo& info, const Problem& problem, const RunOptions& given_options,
                   AttentionTensors* tensors) {
  problem.validate();
  require_supported(info, problem);
  RunResult result;
  result.schedule = info.name;
  result.blocks = resolve_blocks(info, problem, given_options);
  RunOptions options = given_options;
  if (given_options.blocks.given()) {
    result.block_rule = "given";
  } else if (given_options.block_rule == BlockRule::paper && has_paper_block_rule(info.name)) {
    // The paper's rule keeps its own accounting (M/4 per Q_i, K_j, V_j, O_i): the arena holds
    // what the schedule really holds at these blocks, which may exceed M.
    result.block_rule = "paper";
    options.sram_bytes = std::max(options.sram_bytes, working_set_bytes(info.name, problem, result.blocks));
  } else {
    result.block_rule = "fitting";
  }
  result.arena_bytes = options.sram_bytes;
  result.heads_total = static_cast<std::int64_t>(problem.batch) * problem.heads_q;
  const bool backward = info.pass == Pass::backward;
  // A unit: one query head, or one KV head's group of query heads (backward; K/V sharing).
  const int unit_heads = unit_heads_of(info, problem);
  const int units_per_sequence = problem.heads_q / unit_heads;
  try {
    require_within_limits(info, problem, options, cost_of(info, problem, options, result.blocks, tensors != nullptr));

    if (options.memory == MemoryKind::data) {
      if (tensors == nullptr) {
        result.tensors = random_tensors(problem, options.seed, backward);
        tensors = &result.tensors;
      } else if (backward && (tensors->dO.values.empty() || tensors->dQ.values.empty())) {
        throw std::invalid_argument("schedule '" + info.name + "' is a backward pass: the tensors need dO, dQ, dK, dV "
                                    "(AttentionTensors::allocate(problem, true)); allowed: tensors with backward buffers");
      }
      if (backward) prepare_forward_outputs(problem, *tensors);
      for (int b = 0; b < problem.batch; ++b) {
        for (int unit = 0; unit < units_per_sequence; ++unit) {
          result.counters += run_unit<DataMemory>(info, problem, options, result.blocks, tensors, b, unit * unit_heads,
                                                  unit_heads, result.heads_run);
        }
      }
      return result;
    }
    if (options.every_head) {
      for (int b = 0; b < problem.batch; ++b) {
        for (int unit = 0; unit < units_per_sequence; ++unit) {
          result.counters += run_unit<ShapeMemory>(info, problem, options, result.blocks, nullptr, b, unit * unit_heads,
                                                   unit_heads, result.heads_run);
        }
      }
      return result;
    }
    for (const UnitClass& unit : unit_classes(problem, unit_heads)) {
      const Counters counted = run_unit<ShapeMemory>(info, problem, options, result.blocks, nullptr, unit.b,
                                                     unit.first_head, unit_heads, result.heads_run);
      result.counters += scaled(counted, unit.count);
    }
    return result;
  } catch (const SizeOverflow& error) {  // a count past int64: said with the problem that made it
    throw SizeOverflow(describe(info, problem, options.memory) + ": " + error.what());
  }
}

}  // namespace

const std::vector<ScheduleInfo>& schedules() {
  static const std::vector<ScheduleInfo> registry = make_registry();
  return registry;
}

const ScheduleInfo& find_schedule(std::string_view name) {
  for (const ScheduleInfo& info : schedules()) {
    if (info.name == name) return info;
  }
  throw std::invalid_argument("schedule '" + std::string(name) + "' is unknown; allowed: " + schedule_names());
}

void require_supported(const ScheduleInfo& info, const Problem& problem) {
  if (info.unsupported == nullptr) return;
  if (const std::string refusal = info.unsupported(problem); !refusal.empty()) throw std::invalid_argument(refusal);
}

RingTiling ring_tiling(const BlockSizes& blocks) {
  return {{blocks.block_rows, blocks.block_cols}, blocks.devices > 0 ? blocks.devices : 4, blocks.ordering};
}

std::string schedule_names(const char* separator) {
  std::string names;
  for (const ScheduleInfo& info : schedules()) names += (names.empty() ? "" : separator) + info.name;
  return names;
}

RunCost run_cost(std::string_view name, const Problem& problem, const RunOptions& options, bool caller_tensors) {
  const ScheduleInfo& info = find_schedule(name);
  problem.validate();
  require_supported(info, problem);
  try {
    return cost_of(info, problem, options, resolve_blocks(info, problem, options), caller_tensors);
  } catch (const SizeOverflow& error) {
    throw SizeOverflow(describe(info, problem, options.memory) + ": " + error.what());
  }
}

void require_within_limits(std::string_view name, const Problem& problem, const RunOptions& options, const RunCost& cost) {
  require_within_limits(find_schedule(name), problem, options, cost);
}

RunResult run_schedule(std::string_view name, const Problem& problem, const RunOptions& options) {
  return run_impl(find_schedule(name), problem, options, nullptr);
}

RunResult run_schedule(std::string_view name, const Problem& problem, const RunOptions& options,
                       AttentionTensors& tensors) {
  if (options.memory != MemoryKind::data) {
    throw std::invalid_argument("run_schedule with caller tensors: memory model 'shape'; allowed: data");
  }
  return run_impl(find_schedule(name), problem, options, &tensors);
}

Counters scaled(const Counters& counters, std::int64_t factor) {
  Counters result = counters;
  const auto scale = [factor](std::int64_t& count, const char* quantity) { count = checked_mul(count, factor, quantity); };
  for (TensorTraffic& t : result.tensor) {
    scale(t.hbm_read_elements, "hbm_read_elements"), scale(t.hbm_write_elements, "hbm_write_elements");
    scale(t.hbm_read_bytes, "hbm_read_bytes"), scale(t.hbm_write_bytes, "hbm_write_bytes");
  }
  scale(result.matmul_flops, "matmul_flops");
  scale(result.exponentials, "exponentials");
  scale(result.other_flops, "other_flops");
  scale(result.loads, "loads");
  scale(result.stores, "stores");
  return result;
}

AttentionTensors random_tensors(const Problem& problem, std::uint64_t seed, bool with_backward) {
  problem.validate();
  AttentionTensors t = AttentionTensors::allocate(problem, with_backward);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](HostTensor& tensor, bool random) {
    for (float& value : tensor.values) value = random ? round_to(tensor.dtype, normal(rng)) : std::nanf("");
  };
  fill(t.Q, true), fill(t.K, true), fill(t.V, true);
  if (with_backward) fill(t.dO, true);
  fill(t.O, false), fill(t.LSE, false), fill(t.dQ, false), fill(t.dK, false), fill(t.dV, false);
  return t;
}

}  // namespace flashlab::sim
