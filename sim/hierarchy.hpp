// The three-level model: what a GPU kernel moves between its thread blocks' shared memory, an L2
// shared by every thread block resident at once, and DRAM.
//
// It runs the kernel's own schedule (the registry's schedule of algorithms/, shape-only) with the
// kernel's tiling (kernels/tilings.hpp, the constants the kernel is compiled with), splits each
// head's tile loads and stores into thread blocks by the schedule's parallel loop
// (ScheduleInfo::parallel_loop), and replays the thread blocks through the L2 (l2_cache.hpp) in
// the kernel's launch order (kernels::launch_order, the grid the launchers use):
//   - SMs x blocks per SM thread blocks are resident at once; each issues its next tile access in
//     turn (round robin), and a finished block's slot takes the next block of the launch order;
//   - blocks per SM: the least of what the SM's shared memory, threads and blocks allow and what
//     the kernel's launch bounds ask registers for (FA1 declares none: its ptxas register count);
//   - each thread block's tiles live in the SRAM arena of the registry (its share of the SM's
//     shared memory and registers), so a schedule that holds more than that is refused;
//   - a tile access is the sectors of its rows in the kernel's buffers (the flash layout
//     [batch * seqlen, heads, dim], the statistics' own layouts, FA1's fp32 state, the backward's
//     workspace), each row rounded out to whole 32-byte sectors: what the L2 holds and DRAM moves;
//   - the traffic between the SMs and the L2 is counted per request, as the kernel issues them:
//     a store request counts each sector it writes (FA1's 4-byte stores of its fp32 O state write
//     each sector twice, the backward rungs' 16-byte pieces of dK and dV too), the reductions into
//     dQ are counted apart from the stores, and a cp.async copy (the FA2 rung) fetches a source
//     sector once per destination sector it lands in, so its padded shared rows read 1.5x their
//     bytes from the L2 (async_copy_sectors below; KernelTiling::async_copy_row_bytes).
// Work is per tile, not per element: a run costs O(thread blocks x tile accesses).
//
// Kernels (generation, direction) and the schedules they run:
//   fa1 forward  -> fa1_skip             one thread block per (head, batch), the whole head
//   fa2 forward  -> fa2                  one per (query block, head, batch)
//   fa3 forward  -> fa2                  the same loop; launched in the tile order of tile_order.hpp
//   fa2 backward -> fa2_backward_atomic  one per (key block, head, batch); dQ added in the L2
//   fa3 backward -> fa2_backward_atomic
// The backward's other kernels (D = rowsum(dO o O) and the dQ conversion) are counted apart,
// two-level (every byte once).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/counters.hpp"
#include "algorithms/problem.hpp"
#include "kernels/tilings.hpp"
#include "sim/l2_cache.hpp"
#include "sim/machines.hpp"

namespace flashlab::sim {

struct KernelChoice {
  std::string generation = "fa2";     // "fa1", "fa2", "fa3"
  std::string direction = "forward";  // "forward", "backward"
  bool deterministic = false;         // backward: key blocks start last-first (the deterministic dQ order)
  bool l2_sections = true;            // fa3: the tile orders' L2 sections (false: one section of every
                                      // head: the forward's causal order before them)
  // How the caller lays out Q, K, V, O, dO and the gradients: "flash" ([batch * seqlen, heads, dim],
  // attention_api.hpp's flash_layout; the benchmark binaries Nsight Compute profiles) or "bhsd"
  // ([batch, heads, seqlen, dim], PyTorch's SDPA layout that scripts/bench_kernels.py passes; the
  // forward's LSE then [batch, heads, seqlen]).
  std::string layout = "flash";
};

// Overrides of the machine's GPU, for experiments and tests (0 or -1: the machine's).
struct HierarchyOptions {
  std::int64_t l2_bytes = -1;
  int l2_partitions = 0;
  int sm_count = 0;
  int blocks_per_sm = 0;
};

// What one thread block of the main kernel does, for the time model (time_model.hpp).
struct HierarchyWork {
  std::vector<std::int32_t> block_steps;  // tile steps of each thread block, in launch order
  std::int64_t steps = 0;                 // their sum
  double step_matmul_flops = 0;           // per step, as executed (tiles padded to the kernel's blocks
  double step_scores = 0;                 //   and head dim): 4 Br Bc d forward, 10 Br Bc d backward; Br Bc
  int round_trips_per_step = 0;           // dependent global-memory round trips per step (FA1's O state)
  std::int64_t other_kernels_bytes = 0;   // the backward's other kernels: bytes read and written
  int other_kernels = 0;                  // how many (launched one after another, each streaming)
};

struct HierarchyResult {
  KernelChoice kernel;
  std::string schedule;                 // the registry schedule the kernel runs
  kernels::KernelTiling tiling;         // the kernel's tiling
  int sm_count = 0, blocks_per_sm = 0;
  std::string occupancy_limit;          // what sets blocks_per_sm
  std::int64_t resident_blocks = 0;     // sm_count x blocks_per_sm
  std::int64_t thread_blocks = 0;
  double waves = 0;                     // thread_blocks / resident_blocks
  std::int64_t arena_bytes = 0;         // the SRAM arena of one thread block
  std::int64_t l2_bytes = 0;
  int l2_partitions = 1;
  int sector_bytes = 0;
  Counters two_level;                   // the schedule's count of the whole pass, every kernel (no cache)
  std::int64_t main_read_bytes = 0;     // the main kernel's reads with no cache (sectors), incl. atomics' fills
  std::int64_t main_write_bytes = 0;    // its writes and atomics (sectors)
  L2Counters l2;                        // the main kernel through the L2
  HierarchyWork work;
  double seconds = 0;                   // wall time of the model itself
};

// Runs the three-level model. Throws std::invalid_argument naming the input and the allowed range
// for a kernel, problem or machine it cannot model (an unknown generation, a head dim the kernel
// does not compile, GQA in a backward kernel, a preset without "gpu", a launch past the limits).
HierarchyResult run_hierarchy(const KernelChoice& kernel, const Problem& problem, const Machine& machine,
                              const HierarchyOptions& options = {});

// The sectors the L2 sends for one cp.async copy of `bytes` contiguous bytes from global address
// `source` to shared address `destination` (kernels/common/sm80.cuh: cp.async.cg, 16 bytes per
// thread; cp.async.ca, 4): one per (source sector, destination sector) pair its bytes fall in.
// Where both sit at the same offset within a sector, that is each source sector once; otherwise
// the sector boundaries of the two sides interleave and a source sector is fetched again for each
// destination sector it straddles: S_source + S_destination - 1. The FA2 rung's padded shared rows
// (kSharedRowPadding: one 16-byte chunk) put every odd row of a tile 16 bytes off its source, so a
// tile of 256-byte rows costs 8 sectors per even row and 16 per odd row: 1.5x its bytes, what
// Nsight Compute's l1tex__m_xbar2l1tex_read_bytes measured on the H200 for every FA2 forward and
// backward launch (docs/simulator.md). Copies of 4-byte values that sit at different offsets were
// not measured.
std::int64_t async_copy_sectors(std::int64_t source, std::int64_t destination, std::int64_t bytes, int sector);

// The registry schedule a kernel runs ("fa2 forward" -> "fa2"); throws for an unknown kernel.
std::string kernel_schedule(const KernelChoice& kernel);

}  // namespace flashlab::sim
