// Ring Attention (Liu, Zaharia and Abbeel 2023, "Ring Attention with Blockwise Transformers for
// Near-Infinite Context", Algorithm 1), with the load-balanced causal orderings of Striped
// Attention (Brandon et al. 2023) and of the zig-zag layout later context-parallel works use.
//
// The sequence is split over P devices. Device i keeps its query shard Q_i (and O_i, LSE_i) in
// place for the whole run; the key/value shards travel around the ring: at step s device i holds
// the block of device (i - s) mod P and, while it computes on it, sends it on to device i + 1 and
// receives the next one from device i - 1. After P steps every query shard has met every
// key/value shard. Each step is blockwise attention of Q_i against the block in hand: FA2's
// forward, run as it is (04_fa2_forward.hpp) on the block pair, whose O and LSE are merged into
// the device's running O_i, LSE_i by the log-sum-exp combine (online_softmax.hpp:
// combine_by_lse). The model counts what a GPU implementation over NCCL does: the kernel writes
// the pair's partial O and LSE to HBM, a combine pass merges them into fp32 accumulators.
//
// Orderings (RingOrdering): which positions of the sequence device i holds.
//   contiguous - the paper's layout: device i holds the i-th of P contiguous shards. With a causal
//                mask device i has work only for blocks j <= i: the last device works every step,
//                the first only on its own block.
//   striped    - Striped Attention: device i holds positions i, i + P, i + 2P, ... Every block pair
//                is then a causal triangle (with the diagonal when j <= i, without it when j > i),
//                so every device does about half a block's work at every step.
//   zigzag     - the sequence in 2P chunks; device i holds chunks i and 2P - 1 - i, one early and
//                one late, so that every step costs every device about half a block's work.
// The block pair of a query run and a key run is a band of the score matrix (the global mask
// seen through the two runs' positions); ring_block_pair trims it to the query rows that see a
// key and the keys they see, so FA2 never loads a block the mask hides, and no device idles on
// a masked block pair: it skips it.
//
// The backward pass (as the ring's implementations do it): D, P and the gradients per block pair
// by FA2's backward (07_fa2_backward.hpp) with the final LSE_i, dQ_i accumulated on device i in
// fp32, and dK_j, dV_j accumulated in fp32 buffers that travel around the ring with K_j, V_j,
// one hop behind them, so that after P steps they arrive back at their owner.
//
// What one run of a ring counts: every device's HBM traffic (its memory model, memory_of(i)),
// and per step and device the block it holds and the bytes it sends to the next device over its
// link (RingLog). Links are not HBM traffic here; on a GPU each transferred byte is also read from
// the sender's HBM and written to the receiver's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "04_fa2_forward.hpp"
#include "07_fa2_backward.hpp"
#include "online_softmax.hpp"
#include "limits.hpp"
#include "problem.hpp"
#include "pseudocode.hpp"
#include "run_backward.hpp"
#include "run_schedule.hpp"
#include "tile_memory.hpp"
#include "tiling.hpp"

namespace flashlab {

enum class RingOrdering { contiguous, striped, zigzag };

inline const char* to_string(RingOrdering ordering) {
  switch (ordering) {
    case RingOrdering::contiguous: return "contiguous";
    case RingOrdering::striped: return "striped";
    case RingOrdering::zigzag: return "zigzag";
  }
  return "?";
}

inline RingOrdering ring_ordering_from_string(const std::string& name) {
  for (RingOrdering ordering : {RingOrdering::contiguous, RingOrdering::striped, RingOrdering::zigzag})
    if (name == to_string(ordering)) return ordering;
  throw std::invalid_argument("ring ordering '" + name + "' is unknown; allowed: contiguous, striped, zigzag");
}

struct RingTiling {
  BlockTiling blocks;  // FA2's blocks inside each device
  int devices = 4;     // P
  RingOrdering ordering = RingOrdering::zigzag;

  void validate() const {
    blocks.validate();
    validate_devices();
  }
  void validate_devices() const {
    if (devices < 1 || devices > kMaxRingDevices)
      throw std::invalid_argument("ring devices = " + std::to_string(devices) + "; allowed: 1.." +
                                  std::to_string(kMaxRingDevices));
  }
};

// What the ring cannot run, or "": the block pairs keep each score's mask but not its absolute
// position, which ALiBi, dropout's random stream and a block-sparsity pattern are keyed by.
inline std::string ring_unsupported(const Problem& problem) {
  const bool alibi = std::any_of(problem.alibi_slopes.begin(), problem.alibi_slopes.end(), [](float s) { return s != 0; });
  const char* what = alibi                                ? "ALiBi slopes"
                     : problem.dropout.probability > 0    ? "dropout"
                     : problem.block_sparsity.enabled()   ? "block sparsity"
                                                          : nullptr;
  if (!what) return "";
  return std::string("ring attention: ") + what +
         " given; allowed: masks (causal, windows), softcap, GQA/MQA, varlen, without ALiBi, dropout or block sparsity "
         "(their rules address absolute positions, which a ring's block pairs do not keep)";
}

// One run of a device's shard: `length` tokens at positions first, first + stride, ...
struct RingRun {
  int first = 0;
  int length = 0;
  int stride = 1;
};

// The runs of device `device`'s shard of a sequence of `length` tokens (empty runs left out).
inline std::vector<RingRun> ring_runs(RingOrdering ordering, int devices, int device, int length) {
  const auto boundary = [&](std::int64_t part, std::int64_t parts) { return static_cast<int>(part * length / parts); };
  std::vector<RingRun> runs;
  const auto add = [&](int begin, int end, int stride) {
    if (end > begin) runs.push_back({begin, end - begin, stride});
  };
  switch (ordering) {
    case RingOrdering::contiguous: add(boundary(device, devices), boundary(device + 1, devices), 1); break;
    case RingOrdering::striped:
      if (device < length) runs.push_back({device, (length - device + devices - 1) / devices, devices});
      break;
    case RingOrdering::zigzag: {
      const int late = 2 * devices - 1 - device;
      add(boundary(device, 2 * devices), boundary(device + 1, 2 * devices), 1);
      add(boundary(late, 2 * devices), boundary(late + 1, 2 * devices), 1);
      break;
    }
  }
  return runs;
}

inline int ring_shard_length(RingOrdering ordering, int devices, int device, int length) {
  int total = 0;
  for (const RingRun& run : ring_runs(ordering, devices, device, length)) total += run.length;
  return total;
}

// The part of the score matrix between a query run and a key run that the mask leaves visible:
// query rows [query_rows) of the run, keys [key_rows) of the key run, and the band between them,
// top-left aligned: local query a sees local key b iff
//   a + diagonal_shift - window_left <= b <= a + diagonal_shift + window_right  (-1: unbounded).
struct RingBlockPair {
  Range query_rows, key_rows;
  int diagonal_shift = 0;
  int window_left = -1, window_right = -1;
};

namespace ring_detail {
inline std::int64_t floor_div(std::int64_t a, std::int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return -floor_div(-a, b); }
}  // namespace ring_detail

// The block pair of query run q and key run k (equal strides) for one head, or nothing when the
// mask hides it entirely. Positions: query a is at q.first + q.stride a, key b at k.first +
// k.stride b; the head's rule (offset o, left L, right R) says key p_k is visible from p_q iff
// p_q + o - L <= p_k <= p_q + o + R, that is b <= a + floor((q.first - k.first + o + R) / stride)
// and b >= a + ceil((q.first - k.first + o - L) / stride).
inline std::optional<RingBlockPair> ring_block_pair(const HeadProblem& head, const RingRun& q, const RingRun& k) {
  using ring_detail::ceil_div;
  using ring_detail::floor_div;
  if (q.stride != k.stride) throw std::logic_error("ring_block_pair: runs of strides " + std::to_string(q.stride) +
                                                   " and " + std::to_string(k.stride));
  const MaskRule global = head.mask_rule();
  const bool right_bounded = global.right >= 0, left_bounded = global.left >= 0;
  const std::int64_t delta = std::int64_t{q.first} - k.first + global.offset, stride = q.stride;
  const std::int64_t hi = right_bounded ? floor_div(delta + global.right, stride) : 0;  // b <= a + hi
  const std::int64_t lo = left_bounded ? ceil_div(delta - global.left, stride) : 0;    // b >= a + lo
  if (right_bounded && left_bounded && lo > hi) return std::nullopt;  // the band falls between two strides
  // The rows that see a key of the run (a + hi >= 0, a + lo <= k.length - 1), and the keys they see.
  const std::int64_t first_row = right_bounded ? std::max<std::int64_t>(0, -hi) : 0;
  const std::int64_t last_row = left_bounded ? std::min<std::int64_t>(q.length - 1, k.length - 1 - lo) : q.length - 1;
  if (first_row > last_row) return std::nullopt;
  const std::int64_t first_key = left_bounded ? std::max<std::int64_t>(0, first_row + lo) : 0;
  const std::int64_t last_key = right_bounded ? std::min<std::int64_t>(k.length - 1, last_row + hi) : k.length - 1;
  if (first_key > last_key) return std::nullopt;
  RingBlockPair pair;
  pair.query_rows = {static_cast<int>(first_row), static_cast<int>(last_row - first_row + 1)};
  pair.key_rows = {static_cast<int>(first_key), static_cast<int>(last_key - first_key + 1)};
  // Top-left aligned in the pair: query a' = a - first_row sees key b' = b - first_key iff
  // b' <= a' + first_row + hi - first_key (and b' >= a' + first_row + lo - first_key).
  if (right_bounded) {
    pair.window_right = 0;
    pair.window_left = left_bounded ? static_cast<int>(hi - lo) : -1;
    pair.diagonal_shift = static_cast<int>(first_row + hi - first_key);
  } else if (left_bounded) {
    pair.window_left = 0;
    pair.diagonal_shift = static_cast<int>(first_row + lo - first_key);
  }
  return pair;
}

// The head of a block pair: FA2 runs it as a problem of its own.
inline HeadProblem ring_pair_head(const HeadProblem& head, const RingBlockPair& pair) {
  HeadProblem sub = head;
  sub.seqlen_q = pair.query_rows.size;
  sub.seqlen_k = pair.key_rows.size;
  sub.mask = Mask{};
  sub.mask.alignment = CausalAlignment::top_left;
  sub.mask.window_left = pair.window_left;
  sub.mask.window_right = pair.window_right;
  sub.diagonal_shift = pair.diagonal_shift;
  return sub;
}

// Rows `part` of a run, in an HBM tensor that holds the whole sequence (the device's shard is
// those rows: on a GPU they are its own memory).
inline HbmMatrix ring_view(const HbmMatrix& tensor, const RingRun& run, Range part) {
  HbmMatrix view = tensor;
  if (tensor.data) view.data = tensor.data + static_cast<std::ptrdiff_t>(run.first + std::int64_t{run.stride} * part.begin) * tensor.row_stride;
  view.rows = part.size;
  view.row_stride = tensor.row_stride * run.stride;
  return view;
}

// What each device did at each step. Plain data, filled by the schedule when asked.
struct RingDeviceStep {
  int block = 0;                   // the key/value block (its owner device) held in this step
  std::int64_t hbm_bytes = 0;      // this device's HBM traffic in the step (step 0 also its set-up,
  std::int64_t matmul_flops = 0;   //   the last step also its final conversion)
  std::int64_t exponentials = 0;
  std::int64_t other_flops = 0;
  std::int64_t link_bytes = 0;     // sent to the next device during the step
};
struct RingLog {
  int devices = 0;
  std::vector<std::vector<RingDeviceStep>> steps;  // [step][device]
};

// The largest block pair a ring makes: its longest query run against its longest key run (a
// problem of that size stands for every pair in the working sets below).
inline Problem ring_largest_pair(const Problem& p, const RingTiling& tiling) {
  const auto longest = [&](int length) {
    int most = 1;
    for (int i = 0; i < tiling.devices; ++i)
      for (const RingRun& run : ring_runs(tiling.ordering, tiling.devices, i, length)) most = std::max(most, run.length);
    return most;
  };
  Problem pair = p;
  pair.seqlen_q = longest(p.seqlen_q), pair.seqlen_k = longest(p.seqlen_k);
  return pair;
}

// Its working sets (tiling.hpp: WorkingSetDims), at the largest pair: FA2's, or the merge's
// larger one: O_i (fp32), the partial O (dtype), and LSE, LSE_b, m, the two weights and the new
// LSE (fp32).
inline std::int64_t ring_working_set_bytes(const Problem& p, const RingTiling& tiling) {
  const Problem pair = ring_largest_pair(p, tiling);
  const WorkingSetDims t(pair, tiling.blocks.block_rows, tiling.blocks.block_cols);
  const CheckedInt64 merge = t.r * t.dv * (t.f + t.e) + 6 * t.f * t.r;
  return std::max(fa2_working_set_bytes(pair, tiling.blocks.block_rows, tiling.blocks.block_cols), merge.value());
}
// Backward: FA2's backward, or adding a pair's gradient (dtype) into an fp32 accumulator.
inline std::int64_t ring_backward_working_set_bytes(const Problem& p, const RingTiling& tiling) {
  const Problem pair = ring_largest_pair(p, tiling);
  const WorkingSetDims t(pair, tiling.blocks.block_rows, tiling.blocks.block_cols);
  const std::int64_t add_rows = std::max((t.r * t.d * (t.f + t.e)).value(), (t.c * std::max(t.d, t.dv) * (t.f + t.e)).value());
  return std::max(fa2_backward_working_set_bytes(pair, tiling.blocks.block_rows, tiling.blocks.block_cols), add_rows);
}

namespace ring_detail {

// accumulator += part (rows `block_rows` at a time): the accumulator read and written in fp32.
template <class Memory>
void add_into(Memory& mem, const HbmMatrix& accumulator, const HbmMatrix& part, int block_rows) {
  for (int begin = 0; begin < part.rows; begin += block_rows) {
    const Range rows{begin, std::min(block_rows, part.rows - begin)};
    Tile sum = mem.load(accumulator, rows);
    Tile addend = mem.load(part, rows);
    mem.add(sum, addend);
    mem.store(accumulator, rows, sum);
  }
}

// LSE = -inf on the rows of a view (a device's running LSE before any block).
template <class Memory>
void fill_lse(Memory& mem, const HbmMatrix& lse, int block_rows) {
  for (int begin = 0; begin < lse.rows; begin += block_rows) {
    const Range rows{begin, std::min(block_rows, lse.rows - begin)};
    Tile none = mem.vector(TensorId::LSE, rows, kNegInf);
    mem.store(lse, rows, none);
  }
}

// Counts a device's step into the log from its counters before and after.
inline void log_step(RingLog* log, int step, int device, int block, const Counters& before, const Counters& after,
                     std::int64_t link_bytes) {
  if (!log) return;
  RingDeviceStep& entry = log->steps[static_cast<std::size_t>(step)][static_cast<std::size_t>(device)];
  entry.block = block;
  entry.hbm_bytes += after.hbm_bytes() - before.hbm_bytes();
  entry.matmul_flops += after.matmul_flops - before.matmul_flops;
  entry.exponentials += after.exponentials - before.exponentials;
  entry.other_flops += after.other_flops - before.other_flops;
  entry.link_bytes += link_bytes;
}

inline void start_log(RingLog* log, int devices) {
  if (!log || log->devices == devices) return;  // a log already started sums the units run into it
  log->devices = devices;
  log->steps.assign(static_cast<std::size_t>(devices), std::vector<RingDeviceStep>(static_cast<std::size_t>(devices)));
}

template <class Heads, class Views>
void require_group(const Heads& heads, const Views& xs, const char* who) {
  if (heads.empty() || heads.size() != xs.size())
    throw std::invalid_argument(std::string(who) + ": " + std::to_string(heads.size()) + " heads and " +
                                std::to_string(xs.size()) + " tensor views; allowed: as many of both, at least one");
}

}  // namespace ring_detail

// The forward pass of one KV group of one sequence (its query heads share K_j, V_j, which travel
// once for the group). memory_of(i) is device i's memory model (one model for all devices counts
// their sum). The lines are those of ring_attention_pseudocode.
template <class DeviceMemory>
void ring_forward(DeviceMemory&& memory_of, std::span<const HeadProblem> heads, const RingTiling& tiling,
                  std::span<const HeadTensors> xs, RingLog* log = nullptr) {
  using Memory = std::remove_reference_t<decltype(memory_of(0))>;
  tiling.validate();
  ring_detail::require_group(heads, xs, "ring_forward");
  const HeadProblem& first = heads.front();
  const int P = tiling.devices, Br = tiling.blocks.block_rows;
  HbmScratch scratch(Memory::with_data);
  // Per query head: the running O_i in fp32 (the output itself when fp32; LSE is fp32 already)
  // and one block pair's partial O and LSE, as the kernel writes them.
  std::vector<HbmMatrix> O_run, O_pair, LSE_pair;
  for (const HeadTensors& x : xs) {
    O_run.push_back(fp32_gradient_accumulator(scratch, x.O));
    O_pair.push_back(scratch.matrix(TensorId::O_partial, first.dtype, first.seqlen_q, first.head_dim_v));
    LSE_pair.push_back(scratch.matrix(TensorId::LSE_partial, DType::fp32, first.seqlen_q, 1));
  }
  std::vector<std::vector<RingRun>> q_runs, k_runs;
  for (int i = 0; i < P; ++i) {
    q_runs.push_back(ring_runs(tiling.ordering, P, i, first.seqlen_q));
    k_runs.push_back(ring_runs(tiling.ordering, P, i, first.seqlen_k));
  }
  ring_detail::start_log(log, P);

  for (int i = 0; i < P; ++i) {  // line 2: on every device, O_i = 0, LSE_i = -inf
    Memory& mem = memory_of(i);
    const Counters before = mem.counters();
    mem.mark_line(2);
    for (std::size_t g = 0; g < xs.size(); ++g) {
      for (const RingRun& run : q_runs[i]) {
        zero_gradient(mem, ring_view(O_run[g], run, {0, run.length}), Br);
        ring_detail::fill_lse(mem, ring_view(xs[g].LSE, run, {0, run.length}), Br);
      }
    }
    ring_detail::log_step(log, 0, i, i, before, mem.counters(), 0);
  }
  for (int step = 0; step < P; ++step) {  // line 3
    for (int i = 0; i < P; ++i) {
      Memory& mem = memory_of(i);
      const Counters before = mem.counters();
      const int j = (i - step + P) % P;  // line 4: the block in hand
      mem.note_ring_step(step, i, j);
      mem.mark_line(4);
      std::int64_t link_bytes = 0;  // line 5: K_j, V_j go on to device i + 1 (not after the last step)
      if (step + 1 < P) {
        for (const RingRun& run : k_runs[j])
          link_bytes += std::int64_t{run.length} * (first.head_dim + first.head_dim_v) * element_bytes(first.dtype);
      }
      for (std::size_t g = 0; g < xs.size(); ++g) {
        for (const RingRun& q : q_runs[i]) {
          for (const RingRun& k : k_runs[j]) {
            const std::optional<RingBlockPair> pair = ring_block_pair(heads[g], q, k);
            if (!pair) continue;  // hidden by the mask: skipped
            HeadTensors sub;
            sub.Q = ring_view(xs[g].Q, q, pair->query_rows);
            sub.K = ring_view(xs[g].K, k, pair->key_rows);
            sub.V = ring_view(xs[g].V, k, pair->key_rows);
            sub.O = ring_view(O_pair[g], q, pair->query_rows);
            sub.LSE = ring_view(LSE_pair[g], q, pair->query_rows);
            mem.mark_line(6);
            const int held = mem.hold_line(6);
            fa2_forward(mem, ring_pair_head(heads[g], *pair), tiling.blocks, sub);  // line 6
            mem.hold_line(held);
            mem.mark_line(7);  // line 7: merge the pair's O, LSE into O_i, LSE_i
            const HbmMatrix O = ring_view(O_run[g], q, pair->query_rows), LSE = ring_view(xs[g].LSE, q, pair->query_rows);
            for (int begin = 0; begin < O.rows; begin += Br) {
              const Range rows{begin, std::min(Br, O.rows - begin)};
              Tile o = mem.load(O, rows);
              Tile lse = mem.load(LSE, rows);
              Tile o_pair = mem.load(sub.O, rows);
              Tile lse_pair = mem.load(sub.LSE, rows);
              combine_by_lse(mem, o, lse, o_pair, lse_pair);
              mem.store(O, rows, o);
              mem.store(LSE, rows, lse);
            }
          }
        }
      }
      if (step + 1 == P) {  // line 9: O_i in the output's dtype
        mem.mark_line(9);
        for (std::size_t g = 0; g < xs.size(); ++g)
          for (const RingRun& run : q_runs[i])
            convert_gradient(mem, ring_view(O_run[g], run, {0, run.length}), ring_view(xs[g].O, run, {0, run.length}), Br);
      }
      ring_detail::log_step(log, step, i, j, before, mem.counters(), link_bytes);
    }
  }
}

// The backward pass of one KV group of one sequence: O and LSE are the forward's (the final
// LSE_i, so P = exp(S - LSE_i) of a block pair is already the whole softmax's). The lines are
// those of ring_attention_backward_pseudocode.
template <class DeviceMemory>
void ring_backward(DeviceMemory&& memory_of, std::span<const HeadProblem> heads, const RingTiling& tiling,
                   std::span<const HeadTensors> xs, RingLog* log = nullptr) {
  using Memory = std::remove_reference_t<decltype(memory_of(0))>;
  tiling.validate();
  ring_detail::require_group(heads, xs, "ring_backward");
  const HeadProblem& first = heads.front();
  const int P = tiling.devices, Br = tiling.blocks.block_rows, Bc = tiling.blocks.block_cols;
  const int d = first.head_dim, dv = first.head_dim_v;
  HbmScratch scratch(Memory::with_data);
  // dQ_i in fp32 per query head; dK_j, dV_j in fp32 for the group (they travel); one block
  // pair's gradients in the dtype, as the kernel writes them.
  std::vector<HbmMatrix> dQ_run;
  for (const HeadTensors& x : xs) dQ_run.push_back(fp32_gradient_accumulator(scratch, x.dQ));
  const HbmMatrix dK_run = fp32_gradient_accumulator(scratch, xs.front().dK);
  const HbmMatrix dV_run = fp32_gradient_accumulator(scratch, xs.front().dV);
  const HbmMatrix dQ_pair = scratch.matrix(TensorId::dQ, first.dtype, first.seqlen_q, d);
  const HbmMatrix dK_pair = scratch.matrix(TensorId::dK, first.dtype, first.seqlen_k, d);
  const HbmMatrix dV_pair = scratch.matrix(TensorId::dV, first.dtype, first.seqlen_k, dv);
  std::vector<std::vector<RingRun>> q_runs, k_runs;
  for (int i = 0; i < P; ++i) {
    q_runs.push_back(ring_runs(tiling.ordering, P, i, first.seqlen_q));
    k_runs.push_back(ring_runs(tiling.ordering, P, i, first.seqlen_k));
  }
  ring_detail::start_log(log, P);

  for (int i = 0; i < P; ++i) {  // line 2: dQ_i = 0; dK_i = dV_i = 0, which start travelling
    Memory& mem = memory_of(i);
    const Counters before = mem.counters();
    mem.mark_line(2);
    for (std::size_t g = 0; g < xs.size(); ++g)
      for (const RingRun& run : q_runs[i]) zero_gradient(mem, ring_view(dQ_run[g], run, {0, run.length}), Br);
    for (const RingRun& run : k_runs[i]) {
      zero_gradient(mem, ring_view(dK_run, run, {0, run.length}), Bc);
      zero_gradient(mem, ring_view(dV_run, run, {0, run.length}), Bc);
    }
    ring_detail::log_step(log, 0, i, i, before, mem.counters(), 0);
  }
  for (int step = 0; step < P; ++step) {  // line 3
    for (int i = 0; i < P; ++i) {
      Memory& mem = memory_of(i);
      const Counters before = mem.counters();
      const int j = (i - step + P) % P;  // line 4
      mem.note_ring_step(step, i, j);
      mem.mark_line(4);
      std::int64_t link_bytes = 0;  // K_j, V_j go on (line 5) until the last step, dK_j, dV_j always (line 8)
      for (const RingRun& run : k_runs[j]) {
        if (step + 1 < P) link_bytes += std::int64_t{run.length} * (d + dv) * element_bytes(first.dtype);
        link_bytes += std::int64_t{run.length} * (d + dv) * element_bytes(DType::fp32);
      }
      for (std::size_t g = 0; g < xs.size(); ++g) {
        for (const RingRun& q : q_runs[i]) {
          for (const RingRun& k : k_runs[j]) {
            const std::optional<RingBlockPair> pair = ring_block_pair(heads[g], q, k);
            if (!pair) continue;
            HeadTensors sub;
            for (auto [to, from] : {std::pair{&sub.Q, &xs[g].Q}, std::pair{&sub.O, &xs[g].O}, std::pair{&sub.LSE, &xs[g].LSE},
                                    std::pair{&sub.dO, &xs[g].dO}})
              *to = ring_view(*from, q, pair->query_rows);
            sub.K = ring_view(xs[g].K, k, pair->key_rows);
            sub.V = ring_view(xs[g].V, k, pair->key_rows);
            sub.dQ = ring_view(dQ_pair, q, pair->query_rows);
            sub.dK = ring_view(dK_pair, k, pair->key_rows);
            sub.dV = ring_view(dV_pair, k, pair->key_rows);
            mem.mark_line(6);
            const int held = mem.hold_line(6);
            fa2_backward(mem, ring_pair_head(heads[g], *pair), tiling.blocks, sub);  // line 6
            mem.hold_line(held);
            mem.mark_line(7);  // line 7: into dQ_i, and into the travelling dK_j, dV_j
            ring_detail::add_into(mem, ring_view(dQ_run[g], q, pair->query_rows), sub.dQ, Br);
            ring_detail::add_into(mem, ring_view(dK_run, k, pair->key_rows), sub.dK, Bc);
            ring_detail::add_into(mem, ring_view(dV_run, k, pair->key_rows), sub.dV, Bc);
          }
        }
      }
      mem.mark_line(8);  // line 8: dK_j, dV_j go on to device i + 1 (after the last step: home to j)
      if (step + 1 == P) {  // line 10: dQ_i in the output's dtype
        mem.mark_line(10);
        for (std::size_t g = 0; g < xs.size(); ++g)
          for (const RingRun& run : q_runs[i])
            convert_gradient(mem, ring_view(dQ_run[g], run, {0, run.length}), ring_view(xs[g].dQ, run, {0, run.length}), Br);
      }
      ring_detail::log_step(log, step, i, j, before, mem.counters(), link_bytes);
    }
  }
  for (int i = 0; i < P; ++i) {  // line 10, at the owner once dK_i, dV_i are back
    Memory& mem = memory_of(i);
    const Counters before = mem.counters();
    for (const RingRun& run : k_runs[i]) {
      convert_gradient(mem, ring_view(dK_run, run, {0, run.length}), ring_view(xs.front().dK, run, {0, run.length}), Bc);
      convert_gradient(mem, ring_view(dV_run, run, {0, run.length}), ring_view(xs.front().dV, run, {0, run.length}), Bc);
    }
    ring_detail::log_step(log, P - 1, i, (i + 1) % P, before, mem.counters(), 0);
  }
}

// The whole problem: every sequence and KV group, each on P fresh device memories. Returns each
// device's counters summed over the units (traffic and FLOPs; the SRAM peak is the largest);
// log, when given, sums every unit's steps. tensors == nullptr runs shape-only; a backward pass
// needs O and LSE of the forward in the tensors.
template <class Memory = DataMemory>
std::vector<Counters> run_ring(const Problem& problem, AttentionTensors* tensors, std::int64_t sram_capacity_bytes,
                               const RingTiling& tiling, bool backward, RingLog* log = nullptr) {
  problem.validate();
  tiling.validate();
  if (const std::string refusal = ring_unsupported(problem); !refusal.empty()) throw std::invalid_argument(refusal);
  if (tensors == nullptr && Memory::with_data)
    throw std::invalid_argument("run_ring: tensors = null; allowed only with a shape-only memory model");
  std::vector<Counters> devices(static_cast<std::size_t>(tiling.devices));
  const int group = problem.group_size();
  for (int b = 0; b < problem.batch; ++b) {
    for (int kv = 0; kv < problem.heads_kv; ++kv) {
      std::vector<HeadProblem> heads;
      std::vector<HeadTensors> xs;
      for (int h = kv * group; h < (kv + 1) * group; ++h) {
        heads.push_back(head_problem(problem, b, h));
        xs.push_back(tensors ? head_tensors(*tensors, problem, b, h) : shape_only_head_tensors(problem, b));
      }
      std::deque<Memory> memories;  // not movable: their tiles point at their arenas
      for (std::size_t i = 0; i < devices.size(); ++i) memories.emplace_back(MemoryConfig{problem.dtype, sram_capacity_bytes});
      const auto memory_of = [&](int i) -> Memory& { return memories[static_cast<std::size_t>(i)]; };
      if (backward) {
        ring_backward(memory_of, std::span<const HeadProblem>(heads), tiling, std::span<const HeadTensors>(xs), log);
      } else {
        ring_forward(memory_of, std::span<const HeadProblem>(heads), tiling, std::span<const HeadTensors>(xs), log);
      }
      for (std::size_t i = 0; i < devices.size(); ++i) devices[i] += memories[i].counters();
    }
  }
  return devices;
}

// Its pseudocode (pseudocode.hpp), the lines it marks.
inline const Pseudocode& ring_attention_pseudocode() {
  static const Pseudocode code{"Ring Attention forward (Liu, Zaharia and Abbeel 2023, Algorithm 1)",
       {{0, "the sequence split over P devices in a ring (contiguous, striped or zig-zag);"},
        {1, "device i holds Q_i in place and K_i, V_i, which will travel"},
        {2, "on every device i: O_i = 0, LSE_i = -inf"},
        {3, "for step s = 0 .. P - 1, on every device i at once:"},
        {4, "  j = (i - s) mod P: the key/value block in hand"},
        {5, "  send K_j, V_j to device i + 1, receive the next from device i - 1 (overlapped)"},
        {6, "  blockwise attention of Q_i against K_j, V_j (FA2 Algorithm 1; block pairs\n"
            "  hidden by the mask skipped): the pair's O, LSE"},
        {7, "  merge by log-sum-exp: m = max(LSE_i, LSE), O_i = (e^(LSE_i-m) O_i + e^(LSE-m) O)\n"
            "  / (e^(LSE_i-m) + e^(LSE-m)), LSE_i = m + log(e^(LSE_i-m) + e^(LSE-m))"},
        {8, "end for"},
        {9, "write O_i in the output's dtype; return O_i, LSE_i on device i"}}};
  return code;
}

inline const Pseudocode& ring_attention_backward_pseudocode() {
  static const Pseudocode code{"Ring Attention backward (dK, dV travel with K, V)",
       {{0, "device i holds Q_i, O_i, dO_i and the final LSE_i in place; K_i, V_i travel"},
        {1, "D_i = rowsum(dO_i * O_i) (in each block pair's FA2 backward)"},
        {2, "on every device i: dQ_i = 0; dK_i = dV_i = 0 (fp32), which travel with K_i, V_i"},
        {3, "for step s = 0 .. P - 1, on every device i at once:"},
        {4, "  j = (i - s) mod P: K_j, V_j and the accumulators dK_j, dV_j in hand"},
        {5, "  send K_j, V_j on to device i + 1 (overlapped)"},
        {6, "  FA2 Algorithm 2 on Q_i against K_j, V_j with P = exp(S - LSE_i): the pair's dQ, dK, dV"},
        {7, "  dQ_i += dQ; dK_j += dK; dV_j += dV"},
        {8, "  send dK_j, dV_j on to device i + 1 (after step P - 1: home to their owner)"},
        {9, "end for"},
        {10, "write dQ_i, dK_i, dV_i in the outputs' dtype on device i"}}};
  return code;
}

}  // namespace flashlab
