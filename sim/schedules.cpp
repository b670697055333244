#include "schedules.hpp"

#include <map>
#include <random>
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
#include "algorithms/run_backward.hpp"
#include "algorithms/run_schedule.hpp"
#include "closed_forms.hpp"

namespace flashlab::sim {

const char* to_string(MemoryKind kind) { return kind == MemoryKind::data ? "data" : "shape"; }

MemoryKind memory_kind_from_string(const std::string& name) {
  if (name == "data") return MemoryKind::data;
  if (name == "shape") return MemoryKind::shape;
  throw std::invalid_argument("memory model '" + name + "' is unknown; allowed: data, shape");
}

namespace {

using HeadCall = ScheduleInfo::HeadCall;

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
                        .tiled = false},
                       [](auto& mem, const HeadCall& call) {
                         standard_attention(mem, call.head, StandardTiling{call.blocks.block_rows, call.blocks.block_cols}, call.x);
                       }));
  list.push_back(entry({.name = "fa1",
                        .source = "algorithms/03_fa1_forward.hpp",
                        .paper = "FA1 Algorithm 1",
                        .description = "FlashAttention forward: K/V blocks outer, O, l, m re-read and re-written in HBM",
                        .pass = Pass::forward},
                       [](auto& mem, const HeadCall& call) {
                         fa1_forward(mem, call.head, Fa1Tiling{call.blocks.block_rows, call.blocks.block_cols}, call.x);
                       }));
  list.push_back(entry({.name = "fa2",
                        .source = "algorithms/04_fa2_forward.hpp",
                        .paper = "FA2 Algorithm 1",
                        .description = "FlashAttention-2 forward: query blocks outer, O and (m, l) on chip",
                        .pass = Pass::forward},
                       [](auto& mem, const HeadCall& call) {
                         fa2_forward(mem, call.head, Fa2Tiling{call.blocks.block_rows, call.blocks.block_cols}, call.x);
                       }));
  list.push_back(entry({.name = "standard_backward",
                        .source = "algorithms/05_standard_backward.hpp",
                        .paper = "FA1 Algorithm 3",
                        .description = "standard backward: P read from HBM, dP and dS written to and read from HBM",
                        .pass = Pass::backward,
                        .tiled = false},
                       [](auto& mem, const HeadCall& call) {
                         // The residual pass (P as Algorithm 0 left it) is counted apart, not here.
                         standard_backward_from_lse(mem, call.head,
                                                    StandardBackwardTiling{call.blocks.block_rows, call.blocks.block_cols}, call.x);
                       }));
  list.push_back(entry({.name = "fa1_backward",
                        .source = "algorithms/06_fa1_backward.hpp",
                        .paper = "FA1 Algorithm 4",
                        .description = "FlashAttention backward: K/V blocks outer, P recomputed, dQ read-modify-write",
                        .pass = Pass::backward},
                       [](auto& mem, const HeadCall& call) {
                         fa1_backward_from_lse(mem, call.head, Fa1BackwardTiling{call.blocks.block_rows, call.blocks.block_cols},
                                               call.x);
                       }));
  list.push_back(entry({.name = "fa2_backward",
                        .source = "algorithms/07_fa2_backward.hpp",
                        .paper = "FA2 Algorithm 2",
                        .description = "FlashAttention-2 backward: D precomputed, masked blocks skipped, P from LSE",
                        .pass = Pass::backward},
                       [](auto& mem, const HeadCall& call) {
                         fa2_backward(mem, call.head, Fa2Tiling{call.blocks.block_rows, call.blocks.block_cols}, call.x);
                       }));
  list.push_back(entry({.name = "split_kv",
                        .source = "algorithms/08_split_kv_decode.hpp",
                        .paper = "Flash-Decoding",
                        .description = "split-KV decoding: partial O and LSE per KV chunk, then the log-sum-exp combine",
                        .pass = Pass::decode},
                       [](auto& mem, const HeadCall& call) {
                         SplitKvTiling tiling;
                         tiling.block_rows = call.blocks.block_rows;
                         tiling.block_cols = call.blocks.block_cols;
                         tiling.num_splits = call.blocks.num_splits > 0 ? call.blocks.num_splits : tiling.num_splits;
                         split_kv_forward(mem, call.head, tiling, call.x);
                       }));
  list.push_back(entry({.name = "block_sparse",
                        .source = "algorithms/09_block_sparse.hpp",
                        .paper = "FA1 Algorithm 5",
                        .description = "block-sparse FlashAttention: only blocks with a visible score are loaded and computed",
                        .pass = Pass::forward},
                       [](auto& mem, const HeadCall& call) {
                         fa1_block_sparse_forward(mem, call.head, Fa1Tiling{call.blocks.block_rows, call.blocks.block_cols}, call.x);
                       }));
  list.push_back(entry({.name = "memory_efficient",
                        .source = "algorithms/10_memory_efficient.hpp",
                        .paper = "Rabe and Staats 2021",
                        .description = "memory-efficient attention: chunk summaries written to HBM, combined per query chunk",
                        .pass = Pass::forward},
                       [](auto& mem, const HeadCall& call) {
                         memory_efficient_attention(mem, call.head,
                                                    MemoryEfficientTiling{call.blocks.block_rows, call.blocks.block_cols}, call.x);
                       }));
  list.push_back(entry({.name = "square_tiling",
                        .source = "algorithms/11_square_tiling.hpp",
                        .paper = "Saha and Ye 2024, Algorithm 1",
                        .description = "square tiling for small SRAM: A = exp(QK^T) in HBM, then A V by B x B tiles",
                        .pass = Pass::forward},
                       [](auto& mem, const HeadCall& call) {
                         square_tiling_attention(mem, call.head, SquareTiling{call.blocks.block_rows}, call.x);
                       }));
  return list;
}

template <class Memory>
Counters run_one_head(const ScheduleInfo& info, const HeadProblem& head, const BlockSizes& blocks,
                      const HeadTensors& x, const Problem& problem, const RunOptions& options) {
  Memory mem(MemoryConfig{problem.dtype, options.sram_bytes}, options.trace);
  const HeadCall call{head, blocks, x, Memory::with_data};
  if constexpr (Memory::with_data) {
    info.run_data(mem, call);
  } else {
    info.run_shape(mem, call);
  }
  return mem.counters();
}

// Backward passes read O and LSE of the forward pass: computed here by the FA2 forward, not
// counted.
void prepare_forward_outputs(const Problem& problem, AttentionTensors& tensors) {
  run_per_head<DataMemory>(problem, tensors, 0, [](DataMemory& mem, const HeadProblem& head, const HeadTensors& x) {
    fa2_forward(mem, head, Fa2Tiling{64, 64}, x);
  });
}

BlockSizes resolve_blocks(const ScheduleInfo& info, const Problem& problem, const RunOptions& options) {
  if (options.sram_bytes < 0) {
    throw std::invalid_argument("sram_bytes = " + std::to_string(options.sram_bytes) + "; allowed: >= 0 (0: unbounded)");
  }
  if (options.blocks.num_splits < 0) {
    throw std::invalid_argument("num_splits = " + std::to_string(options.blocks.num_splits) + "; allowed: >= 1 (0: 4)");
  }
  if (options.blocks.given()) {
    if (options.blocks.block_rows < 1 || options.blocks.block_cols < 1) {
      throw std::invalid_argument("block sizes " + std::to_string(options.blocks.block_rows) + " x " +
                                  std::to_string(options.blocks.block_cols) + "; allowed: both >= 1");
    }
    return options.blocks;
  }
  if (options.sram_bytes == 0) {
    throw std::invalid_argument("schedule '" + info.name + "': neither block sizes nor an SRAM size M given; allowed: M >= 1 byte or explicit block sizes");
  }
  BlockSizes derived = derive_blocks(info.name, problem, options.sram_bytes);
  derived.num_splits = options.blocks.num_splits;  // split_kv: a split count may come with derived blocks
  return derived;
}

// The forward heads of a problem, or for backward passes the KV-head groups (run_backward.hpp:
// with GQA/MQA each query head writes its dK, dV into an fp32 buffer and the group is summed in
// head order). Data runs execute every unit; shape runs one unit per class of units that must
// count the same (sequence lengths; ALiBi on or off per head), multiplied by the class size.
struct UnitKey {
  int seqlen_q, seqlen_k;
  std::vector<bool> alibi;  // per query head of the unit
  auto operator<=>(const UnitKey&) const = default;
};

template <class Memory>
Counters run_unit(const ScheduleInfo& info, const Problem& problem, const RunOptions& options, const BlockSizes& blocks,
                  AttentionTensors* tensors, int b, int first_head, int heads, std::int64_t& heads_run) {
  const bool backward = info.pass == Pass::backward;
  const bool grouped = backward && heads > 1;
  auto views = [&](int h) {
    if constexpr (Memory::with_data) return head_tensors(*tensors, problem, b, h);
    return shape_only_head_tensors(problem, b);  // run_backward.hpp: shapes, no data
  };
  Counters total;
  HbmScratch group_buffers(Memory::with_data);
  std::vector<HbmMatrix> dk_parts, dv_parts;
  for (int h = first_head; h < first_head + heads; ++h) {
    HeadTensors x = views(h);
    if (grouped) {
      x.dK = group_buffers.matrix(TensorId::dK, DType::fp32, x.K.rows, x.K.cols);
      x.dV = group_buffers.matrix(TensorId::dV, DType::fp32, x.V.rows, x.V.cols);
      dk_parts.push_back(x.dK);
      dv_parts.push_back(x.dV);
    }
    total += run_one_head<Memory>(info, head_problem(problem, b, h), blocks, x, problem, options);
    ++heads_run;
  }
  if (grouped) {  // the GQA/MQA reduction of dK and dV (run_backward.hpp)
    const HeadTensors last = views(first_head + heads - 1);
    Memory mem(MemoryConfig{problem.dtype, options.sram_bytes}, options.trace);
    sum_group_gradients(mem, dk_parts, last.dK, group_reduction_block_rows(options.sram_bytes, last.dK.cols));
    sum_group_gradients(mem, dv_parts, last.dV, group_reduction_block_rows(options.sram_bytes, last.dV.cols));
    total += mem.counters();
  }
  return total;
}

RunResult run_impl(const ScheduleInfo& info, const Problem& problem, const RunOptions& options,
                   AttentionTensors* tensors) {
  problem.validate();
  RunResult result;
  result.schedule = info.name;
  result.blocks = resolve_blocks(info, problem, options);
  result.heads_total = static_cast<std::int64_t>(problem.batch) * problem.heads_q;
  const bool backward = info.pass == Pass::backward;
  // A unit: one query head (forward) or one KV head's group of query heads (backward).
  const int unit_heads = backward ? problem.group_size() : 1;
  const int units_per_sequence = problem.heads_q / unit_heads;

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

  std::map<UnitKey, std::pair<std::int64_t, std::pair<int, int>>> classes;  // key -> (count, (b, unit))
  for (int b = 0; b < problem.batch; ++b) {
    for (int unit = 0; unit < units_per_sequence; ++unit) {
      if (options.every_head) {
        result.counters += run_unit<ShapeMemory>(info, problem, options, result.blocks, nullptr, b, unit * unit_heads,
                                                 unit_heads, result.heads_run);
        continue;
      }
      UnitKey key{problem.seqlen_q_of(b), problem.seqlen_k_of(b), {}};
      for (int h = unit * unit_heads; h < (unit + 1) * unit_heads; ++h) {
        key.alibi.push_back(!problem.alibi_slopes.empty() && problem.alibi_slopes[h] != 0.0f);
      }
      auto [it, inserted] = classes.try_emplace(std::move(key), 0, std::pair{b, unit});
      ++it->second.first;
    }
  }
  for (const auto& [key, value] : classes) {
    const auto [count, where] = value;
    const Counters unit = run_unit<ShapeMemory>(info, problem, options, result.blocks, nullptr, where.first,
                                                where.second * unit_heads, unit_heads, result.heads_run);
    result.counters += scaled(unit, count);
  }
  return result;
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

std::string schedule_names(const char* separator) {
  std::string names;
  for (const ScheduleInfo& info : schedules()) names += (names.empty() ? "" : separator) + info.name;
  return names;
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
  for (TensorTraffic& t : result.tensor) {
    t.hbm_read_elements *= factor, t.hbm_write_elements *= factor;
    t.hbm_read_bytes *= factor, t.hbm_write_bytes *= factor;
  }
  result.matmul_flops *= factor;
  result.exponentials *= factor;
  result.other_flops *= factor;
  result.loads *= factor;
  result.stores *= factor;
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
