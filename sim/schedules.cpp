#include "schedules.hpp"

#include <map>
#include <random>
#include <stdexcept>
#include <tuple>

#include "algorithms/04_fa2_forward.hpp"
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
  list.push_back(entry({.name = "fa2",
                        .source = "algorithms/04_fa2_forward.hpp",
                        .paper = "FA2 Algorithm 1",
                        .description = "FlashAttention-2 forward: query blocks outer, O and (m, l) on chip",
                        .pass = Pass::forward},
                       [](auto& mem, const HeadCall& call) {
                         fa2_forward(mem, call.head, Fa2Tiling{call.blocks.block_rows, call.blocks.block_cols}, call.x);
                       }));
  return list;
}

HbmMatrix shape_matrix(TensorId id, DType dtype, int rows, int cols) { return {id, dtype, nullptr, rows, cols, cols}; }

// The HBM views of one head for a shape-only run: shapes, no data.
HeadTensors shape_tensors(const HeadProblem& head) {
  const DType t = head.dtype;
  const int nq = head.seqlen_q, nk = head.seqlen_k, d = head.head_dim, dv = head.head_dim_v;
  HeadTensors x;
  x.Q = shape_matrix(TensorId::Q, t, nq, d);
  x.K = shape_matrix(TensorId::K, t, nk, d);
  x.V = shape_matrix(TensorId::V, t, nk, dv);
  x.O = shape_matrix(TensorId::O, t, nq, dv);
  x.LSE = shape_matrix(TensorId::LSE, DType::fp32, nq, 1);
  x.dO = shape_matrix(TensorId::dO, t, nq, dv);
  x.dQ = shape_matrix(TensorId::dQ, t, nq, d);
  x.dK = shape_matrix(TensorId::dK, t, nk, d);
  x.dV = shape_matrix(TensorId::dV, t, nk, dv);
  return x;
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
  return derive_blocks(info.name, problem, options.sram_bytes);
}

RunResult run_impl(const ScheduleInfo& info, const Problem& problem, const RunOptions& options,
                   AttentionTensors* tensors) {
  problem.validate();
  RunResult result;
  result.schedule = info.name;
  result.blocks = resolve_blocks(info, problem, options);
  result.heads_total = static_cast<std::int64_t>(problem.batch) * problem.heads_q;

  if (options.memory == MemoryKind::data) {
    const bool backward = info.pass == Pass::backward;
    if (tensors == nullptr) {
      result.tensors = random_tensors(problem, options.seed, backward);
      tensors = &result.tensors;
    }
    if (backward) prepare_forward_outputs(problem, *tensors);
    for (int b = 0; b < problem.batch; ++b) {
      for (int h = 0; h < problem.heads_q; ++h) {
        const HeadProblem head = head_problem(problem, b, h);
        const HeadTensors x = head_tensors(*tensors, problem, b, h);
        result.counters += run_one_head<DataMemory>(info, head, result.blocks, x, problem, options);
        ++result.heads_run;
      }
    }
    return result;
  }

  // Shape-only: one head per class of heads that must count the same, multiplied.
  using ClassKey = std::tuple<int, int, bool>;  // seqlen_q, seqlen_k, ALiBi on
  std::map<ClassKey, std::int64_t> class_sizes;
  std::map<ClassKey, std::pair<int, int>> representative;
  for (int b = 0; b < problem.batch; ++b) {
    for (int h = 0; h < problem.heads_q; ++h) {
      const bool alibi = !problem.alibi_slopes.empty() && problem.alibi_slopes[h] != 0.0f;
      const ClassKey key{problem.seqlen_q_of(b), problem.seqlen_k_of(b), alibi};
      if (options.every_head) {
        const HeadProblem head = head_problem(problem, b, h);
        result.counters += run_one_head<ShapeMemory>(info, head, result.blocks, shape_tensors(head), problem, options);
        ++result.heads_run;
        continue;
      }
      if (class_sizes[key]++ == 0) representative[key] = {b, h};
    }
  }
  for (const auto& [key, size] : class_sizes) {
    const auto [b, h] = representative[key];
    const HeadProblem head = head_problem(problem, b, h);
    result.counters += scaled(run_one_head<ShapeMemory>(info, head, result.blocks, shape_tensors(head), problem, options), size);
    ++result.heads_run;
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
