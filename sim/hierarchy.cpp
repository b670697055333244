#include "hierarchy.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <stdexcept>
#include <string>

#include "algorithms/checked_math.hpp"
#include "sim/schedules.hpp"

namespace flashlab::sim {

namespace {

// The registers per thread of kernels whose launch bounds declare no blocks per SM: the FA1 rung,
// 128 at both head dims (ptxas -v for sm_90a, docs/bench/h200_ptxas_fa1_sm90a.txt).
constexpr int kFa1RegistersPerThread = 128;
// The work a model run may take: thread blocks of one launch, and tile accesses in all (about
// 100 ns each).
constexpr std::int64_t kMaxThreadBlocks = std::int64_t{1} << 24;
constexpr std::int64_t kMaxTileAccesses = std::int64_t{1} << 29;
// The rows of padding after each sequence in the backward's fp32 dQ accumulator
// (kernels/02_fa2_sm80/backward_tiling.hpp: kDqRowPadding; both backward rungs use it).
constexpr std::int64_t kDqRowPadding = 128;

[[noreturn]] void refuse(const std::string& message) { throw std::invalid_argument("hardware model: " + message); }

// A buffer of the kernel in device memory: element (batch, row, head, col) is at
// base + (batch batch_stride + row row_stride + head head_stride + col) element_bytes.
struct Buffer {
  const char* name = "";
  std::int64_t base = 0;
  int element_bytes = 2;
  std::int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
  bool kv_side = false;  // indexed by the KV head (K, V, dK, dV)
  std::int64_t bytes = 0;
};

// One tile access of a thread block, head-free: the buffer, rows and columns of its tile.
struct TileAccess {
  std::uint8_t buffer = 0;
  L2Cache::Access kind = L2Cache::Access::read;
  std::uint8_t passes = 1;       // stores: requests per sector
  std::uint8_t piece_bytes = 0;  // stores: >0, each request writes this many bytes of one row (in one sector)
  std::int32_t row_begin = 0, rows = 0, col_begin = 0, cols = 0;
};

// How a kernel stores a tile: `passes` requests write each sector (coalesced rows: 1), or each
// request writes `piece_bytes` contiguous bytes of a row.
struct StoreRequests {
  int buffer = 0;
  int passes = 1;
  int piece_bytes = 0;
};

struct ThreadBlockStream {
  std::vector<TileAccess> accesses;
  std::int32_t steps = 0;
};

// The buffers of a kernel, laid out one after another (256-byte aligned, as cudaMalloc's).
class BufferTable {
 public:
  int add(Buffer buffer, std::int64_t elements) {
    buffer.base = next_;
    buffer.bytes = checked_mul(elements, buffer.element_bytes, "bytes of a kernel buffer");
    next_ = checked_add(next_, (buffer.bytes + 255) / 256 * 256, "bytes of the kernel buffers");
    buffers_.push_back(buffer);
    return static_cast<int>(buffers_.size()) - 1;
  }
  const Buffer& operator[](int index) const { return buffers_[static_cast<std::size_t>(index)]; }

 private:
  std::vector<Buffer> buffers_;
  std::int64_t next_ = 1 << 20;
};

// The sectors of rows [r0, r0 + rows) x cols [c0, c0 + cols) of head `head` of sequence `batch`.
L2UnitKey unit_of(const Buffer& b, const TileAccess& a, int head, int batch, int sector) {
  const std::int64_t e = b.element_bytes;
  const std::int64_t first = b.base + (batch * b.batch_stride + a.row_begin * b.row_stride + head * b.head_stride + a.col_begin) * e;
  const std::int64_t span = a.cols * e, stride = b.row_stride * e;
  std::int64_t sectors = 0;
  if (a.rows == 1 || stride == span) {  // one contiguous range
    sectors = (first + a.rows * span + sector - 1) / sector - first / sector;
  } else if (stride % sector == 0 && stride >= span) {  // every row alike, no sector shared between rows
    sectors = a.rows * ((first % sector + span + sector - 1) / sector);
  } else {  // rows closer than a sector, or unaligned: count each sector once, in address order
    std::int64_t covered = -1;  // one past the last sector counted
    for (int r = 0; r < a.rows; ++r) {
      const std::int64_t begin = (first + r * stride) / sector, end = (first + r * stride + span + sector - 1) / sector;
      sectors += end - std::max(begin, covered);
      covered = end;
    }
  }
  return {static_cast<std::uint64_t>(first / sector), static_cast<std::uint32_t>(a.rows), static_cast<std::uint32_t>(sectors)};
}

// The sectors of the byte range [offset, offset + bytes) from a sector boundary.
std::int64_t sectors_touched(std::int64_t offset, std::int64_t bytes, int sector) {
  return bytes <= 0 ? 0 : (offset + bytes - 1) / sector - offset / sector + 1;
}

// The L2 -> SM sectors of a read of a kernel that copies global -> shared with cp.async: a 16-bit
// tile into rows `row_bytes` apart from a sector boundary (row r of the tile into shared row r),
// or a per-row statistic (4-byte elements, LSE and D) into a contiguous, sector-aligned array.
std::int64_t async_copy_read_sectors(const Buffer& b, const TileAccess& a, const L2UnitKey& key, int head, int batch,
                                     int sector, int row_bytes) {
  const std::int64_t e = b.element_bytes;
  const std::int64_t first = b.base + (batch * b.batch_stride + a.row_begin * b.row_stride + head * b.head_stride + a.col_begin) * e;
  if (b.element_bytes != 2) {
    if (a.rows != 1 && a.cols != b.row_stride) return key.sectors;  // not a contiguous run: no such copy in the kernels
    return async_copy_sectors(first, 0, static_cast<std::int64_t>(a.rows) * a.cols * e, sector);
  }
  // Row r's source and destination offsets within a sector repeat every `period` rows (2 for the
  // kernels' 16-byte multiples, at most `sector`).
  const std::int64_t span = a.cols * e, stride = b.row_stride * e;
  const std::int64_t period = std::lcm(sector / std::gcd(stride % sector, std::int64_t{sector}),
                                       sector / std::gcd(row_bytes % sector, sector));
  std::int64_t total = 0;
  for (std::int64_t r = 0; r < std::min<std::int64_t>(a.rows, period); ++r) {
    const std::int64_t rows_alike = (a.rows - r + period - 1) / period;
    total += rows_alike * async_copy_sectors(first + r * stride, r * row_bytes, span, sector);
  }
  return total;
}

// Splits a head's events into thread blocks by the schedule's parallel loop and turns each tile
// load and store into a TileAccess of the kernel's buffers (`resolve`).
template <class Resolve>
class StreamRecorder : public TraceSink {
 public:
  StreamRecorder(const ParallelLoop& loop, TensorId step_tensor, Resolve resolve)
      : loop_(loop), step_tensor_(step_tensor), resolve_(std::move(resolve)) {
    if (!loop_.exists()) open();  // the whole head is one thread block
  }

  void record(const TraceEvent& event) noexcept override {
    if (failed_) return;
    try {
      if (event.kind == EventKind::line) return mark(event.line);
      if (event.kind != EventKind::load && event.kind != EventKind::store) return;
      const std::int64_t elements = static_cast<std::int64_t>(event.rows.size) * event.cols.size;
      const int element_bytes = static_cast<int>(event.bytes / std::max<std::int64_t>(elements, 1));
      const bool atomic = event.kind == EventKind::store && event.op != nullptr && std::string_view(event.op) == "atomic_add";
      const L2Cache::Access kind = event.kind == EventKind::load ? L2Cache::Access::read
                                   : atomic                      ? L2Cache::Access::atomic
                                                                 : L2Cache::Access::write;
      if (!inside_) {  // another kernel's access (the backward's D and dQ conversion): counted once
        other_bytes += event.bytes;
        return;
      }
      const StoreRequests stores = resolve_(event.tensor, element_bytes, kind, line_);
      ThreadBlockStream& block = blocks.back();
      block.accesses.push_back({static_cast<std::uint8_t>(stores.buffer), kind, static_cast<std::uint8_t>(stores.passes),
                                static_cast<std::uint8_t>(stores.piece_bytes), event.rows.begin, event.rows.size,
                                event.cols.begin, event.cols.size});
      if (kind == L2Cache::Access::read && event.tensor == step_tensor_) ++block.steps;
    } catch (const std::exception& error) {
      failed_ = true;
      failure = error.what();
    } catch (...) {
      failed_ = true;
      failure = "out of memory";
    }
  }

  std::vector<ThreadBlockStream> blocks;
  std::int64_t other_bytes = 0;
  std::string failure;

 private:
  void open() {
    blocks.emplace_back();
    inside_ = true;
    ended_ = false;
  }
  void mark(int line) {
    line_ = line;
    if (!loop_.exists()) return;
    if (line < loop_.first_line || line > loop_.last_line) {
      inside_ = false;
    } else if (line == loop_.start_line) {
      open();
    } else if (line == loop_.end_line) {
      if (!inside_ || ended_) open();  // an iteration with no start of its own
      ended_ = true;
    }
  }

  ParallelLoop loop_;
  TensorId step_tensor_;
  Resolve resolve_;
  int line_ = 0;
  bool inside_ = false, ended_ = false, failed_ = false;
};

// The tiling the launcher takes: the padded head dim's, and its masked variant where the
// problem's mask takes it (kernels::takes_masked_variant).
const kernels::KernelTiling& kernel_tiling(const std::vector<kernels::KernelTiling>& tilings, const KernelChoice& kernel,
                                           const Problem& problem, const Machine& machine) {
  const int head_dim = problem.head_dim;
  const kernels::KernelTiling* best = nullptr;
  int largest = 0;
  for (const kernels::KernelTiling& t : tilings) {
    if (t.generation != kernel.generation || t.direction != kernel.direction || t.masked_variant) continue;
    largest = std::max(largest, t.head_dim);
    if (t.head_dim >= head_dim && (!best || t.head_dim < best->head_dim)) best = &t;  // the padded head dim it runs on
  }
  if (!best) {
    refuse("head_dim = " + std::to_string(head_dim) + " has no " + kernel.generation + " " + kernel.direction +
           " tiling that fits " + machine.key + "'s " + std::to_string(machine.sram_bytes) +
           " bytes of shared memory per block; allowed: 1.." + std::to_string(largest));
  }
  const Mask& mask = problem.mask;
  if (kernels::takes_masked_variant(kernel.generation, kernel.direction, best->head_dim, mask.causal, mask.window_left,
                                    mask.window_right, problem.seqlen_q)) {
    for (const kernels::KernelTiling& t : tilings) {
      if (t.generation == best->generation && t.direction == best->direction && t.head_dim == best->head_dim &&
          t.masked_variant) {
        return t;
      }
    }
  }
  return *best;
}

}  // namespace

std::int64_t async_copy_sectors(std::int64_t source, std::int64_t destination, std::int64_t bytes, int sector) {
  const std::int64_t source_sectors = sectors_touched(source % sector, bytes, sector);
  if (((source - destination) % sector + sector) % sector == 0) return source_sectors;
  return source_sectors + sectors_touched(destination % sector, bytes, sector) - 1;
}

std::string kernel_schedule(const KernelChoice& kernel) {
  if (kernel.generation != "fa1" && kernel.generation != "fa2" && kernel.generation != "fa3") {
    refuse("kernel '" + kernel.generation + "' is unknown; allowed: fa1, fa2, fa3");
  }
  if (kernel.direction != "forward" && kernel.direction != "backward") {
    refuse("direction '" + kernel.direction + "' is unknown; allowed: forward, backward");
  }
  if (kernel.direction == "backward") {
    if (kernel.generation == "fa1") refuse("the fa1 kernel has no backward; allowed: forward");
    return "fa2_backward_atomic";
  }
  return kernel.generation == "fa1" ? "fa1_skip" : "fa2";
}

HierarchyResult run_hierarchy(const KernelChoice& kernel, const Problem& problem, const Machine& machine,
                              const HierarchyOptions& options) {
  const auto clock_start = std::chrono::steady_clock::now();
  HierarchyResult result;
  result.kernel = kernel;
  result.schedule = kernel_schedule(kernel);
  const bool forward = kernel.direction == "forward", fa1 = kernel.generation == "fa1", fa3 = kernel.generation == "fa3";
  if (!kernel.l2_sections && !fa3) {
    refuse("l2_sections = false with the " + kernel.generation + " " + kernel.direction + " kernel; allowed: the fa3 kernels only");
  }
  if (kernel.deterministic && forward) refuse("deterministic with a forward kernel; allowed: backward kernels only");
  if (kernel.layout != "flash" && kernel.layout != "bhsd") refuse("layout '" + kernel.layout + "' is unknown; allowed: flash, bhsd");

  // The overrides: 0 (or -1 for the L2's size) leaves the machine's.
  if (options.l2_bytes < -1) refuse("l2_bytes = " + std::to_string(options.l2_bytes) + " is out of range; allowed: >= 0 (-1: the machine's)");
  if (options.l2_partitions < 0 || options.l2_partitions > 64) {
    refuse("l2_partitions = " + std::to_string(options.l2_partitions) + " is out of range; allowed: 1..64 (0: the machine's)");
  }
  if (options.sm_count < 0) refuse("sm_count = " + std::to_string(options.sm_count) + " is out of range; allowed: >= 1 (0: the machine's)");
  if (options.blocks_per_sm < 0) {
    refuse("blocks_per_sm = " + std::to_string(options.blocks_per_sm) + " is out of range; allowed: >= 1 (0: the occupancy)");
  }

  // What the kernels run (kernels/attention_api.hpp refuses the rest).
  problem.validate();
  if (!machine.gpu) refuse("machine '" + machine.key + "' has no \"gpu\" description; allowed: a preset with one (h200)");
  const GpuSpec& gpu = *machine.gpu;
  if (problem.varlen()) refuse("varlen batches are not modelled; allowed: equal sequence lengths");
  if (!problem.alibi_slopes.empty() || problem.softcap != 0.0f || problem.dropout.probability != 0.0f ||
      problem.block_sparsity.enabled()) {
    refuse("ALiBi, softcap, dropout and block sparsity are not in the kernels; allowed: none of them");
  }
  if (problem.value_dim() != problem.head_dim) refuse("head_dim_v != head_dim; allowed: equal (as the kernels)");
  if (fa1 ? problem.dtype != DType::fp16 : element_bytes(problem.dtype) != 2) {
    refuse(std::string("dtype ") + to_string(problem.dtype) + " with the " + kernel.generation + " kernel; allowed: " +
           (fa1 ? "fp16" : "bf16 or fp16"));
  }
  if (!forward && problem.heads_kv != problem.heads_q) {
    refuse("GQA/MQA in a backward kernel is not modelled (it packs a group's query heads in one thread block); allowed: "
           "heads_kv = heads_q");
  }
  const int heads_q = problem.heads_q, heads_kv = problem.heads_kv, group = problem.group_size();

  // The kernel's tiling on this machine, and how many of its blocks an SM holds.
  const std::vector<kernels::KernelTiling> tilings =
      kernels::tilings_for_shared_limit(static_cast<int>(std::min<std::int64_t>(machine.sram_bytes, 1 << 30)));
  result.tiling = kernel_tiling(tilings, kernel, problem, machine);
  const kernels::KernelTiling& tiling = result.tiling;
  result.sm_count = options.sm_count > 0 ? options.sm_count : gpu.sm_count;
  const std::int64_t threads = std::int64_t{tiling.warps} * 32;
  const std::pair<std::int64_t, const char*> limits[] = {
      {gpu.shared_bytes_per_sm / (tiling.shared_bytes + gpu.shared_reserved_per_block), "shared memory"},
      {gpu.max_threads_per_sm / threads, "threads"},
      {gpu.max_blocks_per_sm, "blocks per SM"},
      {tiling.min_blocks_per_sm > 0 ? tiling.min_blocks_per_sm : gpu.registers_per_sm / (kFa1RegistersPerThread * threads),
       tiling.min_blocks_per_sm > 0 ? "launch bounds (registers)" : "registers (ptxas: 128 per thread)"}};
  std::int64_t blocks_per_sm = std::numeric_limits<std::int64_t>::max();
  for (const auto& [blocks, what] : limits) {
    if (blocks < blocks_per_sm) blocks_per_sm = blocks, result.occupancy_limit = what;
  }
  if (options.blocks_per_sm > 0) blocks_per_sm = options.blocks_per_sm, result.occupancy_limit = "given";
  if (blocks_per_sm < 1) refuse("a " + kernel.generation + " thread block does not fit one SM of " + machine.key);
  result.blocks_per_sm = static_cast<int>(blocks_per_sm);
  result.resident_blocks = checked_mul(result.sm_count, blocks_per_sm, "resident thread blocks");
  result.arena_bytes = (gpu.shared_bytes_per_sm + 4 * gpu.registers_per_sm) / blocks_per_sm;
  result.l2_bytes = options.l2_bytes >= 0 ? options.l2_bytes : gpu.l2_bytes;
  result.l2_partitions = options.l2_partitions > 0 ? options.l2_partitions : gpu.l2_partitions;
  result.sector_bytes = gpu.l2_sector_bytes;

  // The kernel's buffers (attention_api.hpp: flash_layout [batch * seqlen, heads, dim]; the
  // statistics and workspaces as the rungs lay them out).
  const std::int64_t b = problem.batch, sq = problem.seqlen_q, sk = problem.seqlen_k, d = problem.head_dim;
  const std::int64_t rows_q = b * sq, rows_k = b * sk;
  BufferTable buffers;
  const bool bhsd = kernel.layout == "bhsd";
  auto flash = [&](const char* name, std::int64_t seqlen, int heads, bool kv) {
    const std::int64_t elements = checked_product("buffer elements", b, seqlen, heads, d);
    return bhsd ? buffers.add({name, 0, 2, heads * seqlen * d, d, seqlen * d, kv}, elements)
                : buffers.add({name, 0, 2, seqlen * heads * d, heads * d, d, kv}, elements);
  };
  // [batch * seqlen, heads] fp32 (flash_layout(lse, heads, 1)): the forward's LSE ([batch, heads,
  // seqlen] in the bhsd layout) and FA1's m and l (kernels/01_fa1_sm75: [rows_q, heads_q]).
  auto per_row = [&](const char* name, bool follows_layout) {
    return bhsd && follows_layout ? buffers.add({name, 0, 4, heads_q * sq, 1, sq, false}, rows_q * heads_q)
                                  : buffers.add({name, 0, 4, sq * heads_q, heads_q, 1, false}, rows_q * heads_q);
  };
  const int q = flash("Q", sq, heads_q, false), k = flash("K", sk, heads_kv, true), v = flash("V", sk, heads_kv, true);
  int o = -1, lse = -1, o_state = -1, m = -1, l = -1, d_o = -1, dq = -1, dk = -1, dv = -1, delta = -1, dq_accum = -1;
  if (forward) {
    o = flash("O", sq, heads_q, false);
    lse = per_row("LSE", true);
    if (fa1) {  // kernels/01_fa1_sm75/forward_kernel.cuh: O [rows_q, heads_q, head_dim], m and l [rows_q, heads_q], fp32
      o_state = buffers.add({"O state", 0, 4, sq * heads_q * d, heads_q * d, d, false}, rows_q * heads_q * d);
      m = per_row("m", false);
      l = per_row("l", false);
    }
  } else {
    d_o = flash("dO", sq, heads_q, false);
    dq = flash("dQ", sq, heads_q, false);
    dk = flash("dK", sk, heads_kv, true);
    dv = flash("dV", sk, heads_kv, true);
    // kernels/common/backward_workspace.hpp: LSE and D [heads_q][rows_q] fp32; dQ in fp32
    // [heads_q][rows_q + padding per sequence][padded head dim].
    lse = buffers.add({"LSE (workspace)", 0, 4, sq, 1, rows_q, false}, rows_q * heads_q);
    delta = buffers.add({"D", 0, 4, sq, 1, rows_q, false}, rows_q * heads_q);
    const std::int64_t padded = tiling.head_dim, dq_rows = rows_q + kDqRowPadding * b;
    dq_accum = buffers.add({"dQ (fp32)", 0, 4, (sq + kDqRowPadding) * padded, padded, dq_rows * padded, false},
                           checked_product("dQ accumulator elements", dq_rows, heads_q, padded));
  }
  (void)rows_k;

  // Which buffer a tile of the schedule is, and how the kernel's store requests write it.
  auto resolve = [&](TensorId tensor, int bytes, L2Cache::Access kind, int line) -> StoreRequests {
    const bool fp32 = bytes == 4;
    switch (tensor) {
      case TensorId::Q: return {q};
      case TensorId::K: return {k};
      case TensorId::V: return {v};
      case TensorId::O:
        if (!forward) break;
        if (!fp32) return {o, fa1 ? 4 : 1};  // FA1 stores O as 2-byte halves, 4 requests per sector
        if (fa1) return {o_state, line == 2 ? 1 : 2};  // line 2 zeroes it coalesced; each step stores 4-byte floats, 2 per sector pair
        break;
      case TensorId::LSE: return {lse};
      case TensorId::m: if (fa1) return {m}; break;
      case TensorId::l: if (fa1) return {l}; break;
      case TensorId::dO: if (!forward) return {d_o}; break;
      case TensorId::D: if (!forward) return {delta}; break;
      case TensorId::dQ: if (!forward) return {fp32 ? dq_accum : dq}; break;
      // The FA2 backward stores dK_j and dV_j from the mma accumulators, a 4-byte pair per lane:
      // one warp instruction writes 16 contiguous bytes (an n8 column tile) of each of its rows,
      // so every 32-byte sector of a row takes two requests. The Hopper rung stages them in
      // shared memory and writes whole rows, 16 bytes a lane: one request per sector.
      case TensorId::dK: if (!forward) return fa3 ? StoreRequests{dk} : StoreRequests{dk, 1, 16}; break;
      case TensorId::dV: if (!forward) return fa3 ? StoreRequests{dv} : StoreRequests{dv, 1, 16}; break;
      default: break;
    }
    (void)kind;
    throw std::logic_error(std::string("hardware model: the ") + kernel.generation + " " + kernel.direction +
                           " kernel has no buffer for tensor " + to_string(tensor) + " (" + std::to_string(bytes) + "-byte elements)");
  };

  // One head's tile accesses, by thread block: the registry's schedule with the kernel's blocks, in
  // the SRAM arena of one thread block. One head runs (every head of a dense batch counts alike).
  const ScheduleInfo& info = find_schedule(result.schedule);
  const TensorId step_tensor = forward && !fa1 ? TensorId::K : TensorId::Q;
  StreamRecorder recorder(info.parallel_loop, step_tensor, resolve);
  RunOptions run;
  run.memory = MemoryKind::shape;
  run.blocks = {tiling.block_rows, tiling.block_cols, 0};
  run.sram_bytes = result.arena_bytes;
  run.trace = &recorder;
  run.group_reduction = GroupReduction::in_place;  // one head per group: no reduction either way
  const RunResult counted = run_schedule(result.schedule, problem, run);
  if (!recorder.failure.empty()) throw std::runtime_error("hardware model: recording the schedule failed: " + recorder.failure);
  result.two_level = counted.counters;
  if (counted.heads_run != 1) throw std::logic_error("hardware model: the schedule ran " + std::to_string(counted.heads_run) + " heads, not 1");
  std::vector<ThreadBlockStream>& streams = recorder.blocks;

  // The launch order of the kernel's thread blocks.
  kernels::LaunchShape shape;
  shape.batch = problem.batch, shape.heads_q = heads_q, shape.heads_kv = heads_kv;
  shape.seqlen_q = problem.seqlen_q, shape.seqlen_k = problem.seqlen_k, shape.head_dim = problem.head_dim;
  shape.causal = problem.mask.causal, shape.deterministic = kernel.deterministic;
  if (!kernel.l2_sections) shape.fa3_l2_section_bytes = std::numeric_limits<long long>::max() / 4;
  const std::vector<kernels::ThreadBlockWork> order = kernels::launch_order(tiling, shape, kMaxThreadBlocks);
  result.thread_blocks = static_cast<std::int64_t>(order.size());
  result.waves = static_cast<double>(result.thread_blocks) / static_cast<double>(result.resident_blocks);
  std::int64_t accesses = 0;
  for (const kernels::ThreadBlockWork& w : order) {
    if (w.block < 0 || static_cast<std::size_t>(w.block) >= streams.size()) {
      throw std::logic_error("hardware model: thread block " + std::to_string(w.block) + " of the launch, but the schedule's loop has " +
                             std::to_string(streams.size()) + " iterations");
    }
    accesses = checked_add(accesses, static_cast<std::int64_t>(streams[w.block].accesses.size()), "tile accesses");
  }
  if (accesses > kMaxTileAccesses) {
    refuse("the launch makes " + std::to_string(accesses) + " tile accesses; allowed: at most " + std::to_string(kMaxTileAccesses) +
           " (a shorter sequence or fewer heads)");
  }

  // The thread blocks through the L2: resident blocks take turns, one tile access each.
  L2Cache cache(result.l2_bytes, result.sector_bytes, result.l2_partitions);
  struct Resident {
    const ThreadBlockStream* stream = nullptr;
    std::size_t next = 0;
    int head = 0, batch = 0;
    int side = 0;  // the SM's near L2 partition
  };
  std::vector<Resident> resident(static_cast<std::size_t>(std::min<std::int64_t>(result.resident_blocks, result.thread_blocks)));
  std::size_t launched = 0;
  auto launch_next = [&](Resident& slot) {
    slot.stream = nullptr;
    if (launched == order.size()) return;
    const kernels::ThreadBlockWork& w = order[launched++];
    slot.stream = &streams[w.block];
    slot.next = 0;
    slot.head = w.head, slot.batch = w.batch;
  };
  // Slot s is on SM s mod sm_count (the first wave one block per SM, then the second); the SMs
  // alternate between the L2 partitions (the dispatcher deals consecutive blocks to the GPCs of both).
  for (std::size_t s = 0; s < resident.size(); ++s) {
    launch_next(resident[s]);
    resident[s].side = static_cast<int>(s % static_cast<std::size_t>(result.sm_count)) % result.l2_partitions;
  }
  const int sector = result.sector_bytes, async_copy_row_bytes = tiling.async_copy_row_bytes;
  for (bool busy = true; busy;) {
    busy = false;
    for (Resident& slot : resident) {
      while (slot.stream && slot.next == slot.stream->accesses.size()) launch_next(slot);  // empty blocks
      if (!slot.stream) continue;
      busy = true;
      const TileAccess& a = slot.stream->accesses[slot.next++];
      const Buffer& buffer = buffers[a.buffer];
      const int head = buffer.kv_side && forward ? slot.head / group : slot.head;
      const L2UnitKey key = unit_of(buffer, a, head, slot.batch, sector);
      const std::int64_t bytes = static_cast<std::int64_t>(key.sectors) * sector;
      std::int64_t requested = 0;  // the sectors the SM's requests carry
      if (a.kind == L2Cache::Access::read) {
        result.main_read_bytes += bytes;
        requested = async_copy_row_bytes > 0 ? async_copy_read_sectors(buffer, a, key, head, slot.batch, sector, async_copy_row_bytes)
                                             : key.sectors;
      } else {
        result.main_write_bytes += bytes;
        if (a.kind == L2Cache::Access::atomic) result.main_read_bytes += bytes;
        requested = a.piece_bytes > 0 ? static_cast<std::int64_t>(a.rows) * ((a.cols * buffer.element_bytes + a.piece_bytes - 1) / a.piece_bytes)
                                      : static_cast<std::int64_t>(key.sectors) * a.passes;
      }
      cache.access(key, a.kind, requested, slot.side);
    }
  }
  result.l2 = cache.counters();

  // The work of each thread block, as the kernel executes it (whole tiles at the padded head dim).
  HierarchyWork& work = result.work;
  work.block_steps.reserve(order.size());
  for (const kernels::ThreadBlockWork& w : order) {
    work.block_steps.push_back(streams[w.block].steps);
    work.steps += streams[w.block].steps;
  }
  const double tile = static_cast<double>(tiling.block_rows) * tiling.block_cols;
  work.step_scores = tile;
  work.step_matmul_flops = (forward ? 4.0 : 10.0) * tile * tiling.head_dim;
  // FA1's O state: each thread loads, rescales and stores its d/8 column tiles x 2 rows x 2
  // halves one after another (a load may not pass the store before it), then Q, m and l.
  work.round_trips_per_step = fa1 ? tiling.head_dim / 2 + 2 : 0;
  work.other_kernels_bytes = recorder.other_bytes * problem.batch * heads_q;
  work.other_kernels = forward ? 0 : 2;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start).count();
  return result;
}

}  // namespace flashlab::sim
