// The three-level model (sim/l2_cache.hpp, sim/hierarchy.hpp) and its time model
// (sim/time_model.hpp): the L2 on small cases worked by hand (capacity, LRU order, write-back,
// write-allocate, atomics, partitions), the kernels' sectors (FA2's LSE, FA1's 4-byte stores, the
// FA2 backward's 16-byte pieces of dK and dV and the Hopper rung's whole rows, the reductions,
// cp.async into padded shared rows), the reduction to the two-level count, concurrency, the launch
// orders, repeatability, the time model's structure and the refusals of bad input.
#include <algorithm>
#include <set>
#include <string>
#include <tuple>

#include "catch.hpp"
#include "kernels/03_fa3_sm90/tile_order.hpp"
#include "kernels/tilings.hpp"
#include "sim/hierarchy.hpp"
#include "sim/l2_cache.hpp"
#include "sim/machines.hpp"
#include "sim/schedules.hpp"
#include "sim/time_model.hpp"

using namespace flashlab;
using namespace flashlab::sim;
using flashlab::testing::contains_text;

namespace {

constexpr int kSector = 32;
using Access = L2Cache::Access;

L2UnitKey unit(std::uint64_t first_sector, std::uint32_t sectors = 1) { return {first_sector, 1, sectors}; }

Problem problem_of(int batch, int heads, int seqlen, int head_dim, DType dtype = DType::bf16, bool causal = false) {
  Problem p;
  p.batch = batch;
  p.heads_q = p.heads_kv = heads;
  p.seqlen_q = p.seqlen_k = seqlen;
  p.head_dim = head_dim;
  p.dtype = dtype;
  p.mask.causal = causal;
  return p;
}

HierarchyResult run(const std::string& generation, const std::string& direction, const Problem& problem,
                    HierarchyOptions options = {}) {
  KernelChoice kernel;
  kernel.generation = generation;
  kernel.direction = direction;
  return run_hierarchy(kernel, problem, find_machine("h200"), options);
}

std::int64_t tensor_read(const Counters& c, TensorId id) { return c[id].hbm_read_bytes; }

}  // namespace

TEST_CASE("L2: capacity and least-recently-used order, worked by hand", "[sim][l2]") {
  L2Cache cache(4 * kSector, kSector);  // four one-sector units fit
  for (std::uint64_t a : {1, 2, 3, 4}) cache.access(unit(a), Access::read);
  CHECK(cache.counters().dram_read_bytes == 4 * kSector);
  cache.access(unit(1), Access::read);  // a hit: 1 is now the most recent, 2 the least
  CHECK(cache.counters().dram_read_bytes == 4 * kSector);
  CHECK(cache.counters().read_hit_bytes == kSector);
  cache.access(unit(5), Access::read);  // evicts 2
  cache.access(unit(1), Access::read);  // still held
  cache.access(unit(3), Access::read);  // still held
  CHECK(cache.counters().dram_read_bytes == 5 * kSector);
  cache.access(unit(2), Access::read);  // evicted: read again (and evicts 4)
  CHECK(cache.counters().dram_read_bytes == 6 * kSector);
  cache.access(unit(4), Access::read);
  CHECK(cache.counters().dram_read_bytes == 7 * kSector);
  CHECK(cache.counters().l2_to_sm_bytes == 10 * kSector);  // every read reaches the SM, hit or miss
  CHECK(cache.used_bytes() == 4 * kSector);
  CHECK(cache.counters().reads == 10);
}

TEST_CASE("L2: a unit of many sectors counts its sectors, and one larger than the cache is not kept", "[sim][l2]") {
  L2Cache cache(8 * kSector, kSector);
  cache.access(unit(0, 6), Access::read);
  cache.access(unit(100, 2), Access::read);
  CHECK(cache.used_bytes() == 8 * kSector);
  cache.access(unit(200, 3), Access::read);  // evicts the 6-sector unit
  CHECK(cache.used_bytes() == 5 * kSector);
  cache.access(unit(0, 6), Access::read);  // evicts both others
  CHECK(cache.counters().dram_read_bytes == (6 + 2 + 3 + 6) * kSector);
  cache.access(unit(300, 9), Access::read);  // larger than the cache: passes through
  CHECK(cache.used_bytes() == 0);
  cache.access(unit(300, 9), Access::read);
  CHECK(cache.counters().dram_read_bytes == (6 + 2 + 3 + 6 + 9 + 9) * kSector);
}

TEST_CASE("L2: write-back, write-allocate without a fill, atomics in the L2", "[sim][l2]") {
  L2Cache cache(2 * kSector, kSector);
  cache.access(unit(1), Access::write);  // allocates without reading DRAM
  CHECK(cache.counters().dram_read_bytes == 0);
  CHECK(cache.counters().dirty_at_end_bytes == kSector);
  cache.access(unit(1), Access::read);  // the written value is read back from the L2
  CHECK(cache.counters().dram_read_bytes == 0);
  cache.access(unit(2), Access::read);
  cache.access(unit(3), Access::read);  // evicts dirty 1: written back now
  CHECK(cache.counters().dram_write_bytes == kSector);
  CHECK(cache.counters().dirty_at_end_bytes == 0);
  cache.access(unit(4), Access::atomic);  // a missing unit is fetched for the add, then dirty
  CHECK(cache.counters().dram_read_bytes == 3 * kSector);
  cache.access(unit(4), Access::atomic);  // found: no DRAM
  CHECK(cache.counters().dram_read_bytes == 3 * kSector);
  CHECK(cache.counters().l2_to_sm_bytes == 3 * kSector);  // atomics return nothing
  CHECK(cache.counters().dirty_at_end_bytes == kSector);
  cache.access(unit(5), Access::write, 2);  // two store requests for its one sector
  CHECK(cache.counters().sm_to_l2_write_sectors == 1 + 2);  // stores only
  CHECK(cache.counters().sm_to_l2_reduction_sectors == 2);  // the two atomics
  CHECK(cache.counters().writes == 2);
  CHECK(cache.counters().atomics == 2);
  // A read whose requests carry more sectors than the unit holds: more L2 -> SM bytes, nothing else.
  const L2Counters before = cache.counters();
  cache.access(unit(6, 2), Access::read, 3);
  CHECK(cache.counters().l2_to_sm_bytes - before.l2_to_sm_bytes == 3 * kSector);
  CHECK(cache.counters().dram_read_bytes - before.dram_read_bytes == 2 * kSector);
  CHECK_THROWS_WITH(cache.access(unit(6, 2), Access::read, -1), contains_text("request_sectors = -1"));
}

TEST_CASE("L2: two partitions, an SM reading through its near one", "[sim][l2]") {
  L2Cache cache(4 * kSector, kSector, 2);  // two sectors per partition
  const L2UnitKey a = unit(7);
  const int home = cache.home(a), far = 1 - home;
  cache.access(a, Access::read, 0, far);  // read from DRAM into the home, copied into the near partition
  CHECK(cache.counters().dram_read_bytes == kSector);
  CHECK(cache.used_bytes() == 2 * kSector);
  cache.access(a, Access::read, 0, far);  // near hit
  cache.access(a, Access::read, 0, home);  // the home's own copy
  CHECK(cache.counters().dram_read_bytes == kSector);
  CHECK(cache.counters().read_hit_bytes == 2 * kSector);
  // Two units homed in the far partition fill it; a third evicts the first there, but the near
  // partition still has its copy of it... until two newer copies push it out too.
  std::vector<L2UnitKey> homed_far;
  for (std::uint64_t s = 100; homed_far.size() < 3; ++s) {
    if (cache.home(unit(s)) == far) homed_far.push_back(unit(s));
  }
  L2Cache other(4 * kSector, kSector, 2);
  for (const L2UnitKey& key : homed_far) other.access(key, Access::read, 0, far);  // read on their home side
  CHECK(other.counters().dram_read_bytes == 3 * kSector);
  other.access(homed_far[0], Access::read, 0, home);  // the other side: not in its partition, evicted at home
  CHECK(other.counters().dram_read_bytes == 4 * kSector);
  other.access(homed_far[2], Access::read, 0, home);  // at home: a far hit, no DRAM read
  CHECK(other.counters().dram_read_bytes == 4 * kSector);
  CHECK(other.counters().far_hit_bytes == kSector);
  CHECK_THROWS_WITH(L2Cache(-1, kSector), contains_text("L2 capacity = -1") && contains_text("allowed: >= 0"));
  CHECK_THROWS_WITH(L2Cache(64, 0), contains_text("allowed: >= 1"));
  CHECK_THROWS_WITH(L2Cache(64, kSector, 0), contains_text("L2 partitions = 0") && contains_text("allowed: 1..64"));
}

TEST_CASE("hierarchy: with no L2 the DRAM bytes are the two-level count, rows rounded to sectors", "[sim][hierarchy]") {
  // FA2 forward, d 128 bf16: Q, K, V, O rows are 256 bytes (whole sectors); LSE is one 4-byte value
  // per row at a 64-byte stride in [rows, heads], so each row costs a sector.
  const Problem p = problem_of(2, 16, 640, 128);
  const HierarchyResult r = run("fa2", "forward", p, {.l2_bytes = 0});
  const Counters& c = r.two_level;
  CHECK(r.l2.dram_read_bytes == c.hbm_read_bytes());
  const std::int64_t rows = std::int64_t{2} * 16 * 640;
  CHECK(c[TensorId::LSE].hbm_write_bytes == rows * 4);
  CHECK(r.l2.dram_write_bytes == c[TensorId::O].hbm_write_bytes + rows * kSector);
  CHECK(r.l2.dirty_at_end_bytes == 0);
  CHECK(r.main_read_bytes == c.hbm_read_bytes());
  // Every tile has an even number of rows, half of them 16 bytes off in shared memory (cp.async
  // fetches their sectors twice): 1.5x.
  CHECK(2 * r.l2.l2_to_sm_bytes == 3 * c.hbm_read_bytes());
  // One store request per sector: O's 128 x 256 bytes and LSE's 128 sectors per query block (as
  // Nsight Compute counted 1152 per block on the H200, docs/kernels.md).
  CHECK(r.l2.sm_to_l2_write_sectors == r.thread_blocks * (128 * 256 / kSector + 128));
  CHECK(r.thread_blocks == 2 * 16 * 5);
}

TEST_CASE("hierarchy: FA1's 4-byte stores write each sector of its fp32 O state twice", "[sim][hierarchy]") {
  // Per row and visited (query block, key block) pair: O state 512 bytes = 16 sectors written by
  // 2 requests each, m and l one sector each; the last visit writes O as 2-byte halves (8 sectors, 4
  // requests each), l and m (the schedule's line 13; the kernel skips them there) and LSE; line 2
  // zeroes O state (16 sectors, coalesced), m and l.
  const int seqlen = 256, heads = 16, batch = 1, key_blocks = seqlen / 64;
  const Problem p = problem_of(batch, heads, seqlen, 128, DType::fp16);
  const HierarchyResult r = run("fa1", "forward", p);
  const std::int64_t rows = std::int64_t{batch} * heads * seqlen;
  const std::int64_t per_row = (key_blocks - 1) * (16 * 2 + 2) + (8 * 4 + 2 + 1) + (16 + 2);
  CHECK(r.l2.sm_to_l2_write_sectors == rows * per_row);
  CHECK(r.thread_blocks == batch * heads);  // one block per head
  CHECK(r.work.round_trips_per_step == 128 / 2 + 2);
}

TEST_CASE("hierarchy: cp.async into padded shared rows fetches the odd rows' sectors twice, worked by hand", "[sim][hierarchy]") {
  // The pairs of (source sector, destination sector) one copy's bytes fall in.
  CHECK(async_copy_sectors(0, 0, 256, kSector) == 8);     // aligned alike: each source sector once
  CHECK(async_copy_sectors(0, 16, 256, kSector) == 16);   // 16 bytes apart: 8 + 9 - 1
  CHECK(async_copy_sectors(16, 0, 256, kSector) == 16);   // 9 + 8 - 1
  CHECK(async_copy_sectors(64, 0, 256, kSector) == 8);    // another sector, the same offset in it
  CHECK(async_copy_sectors(0, 16, 16, kSector) == 1);     // one chunk: one pair
  CHECK(async_copy_sectors(4, 0, 256, kSector) == 9 + 8 - 1);
  // FA2 forward, d 128 (rows of 256 bytes, shared pitch 272: row r sits 16 r bytes past a sector
  // boundary), one head of 129 rows: query blocks of 128 + 1 rows, key blocks of 64 + 64 + 1. A
  // tile of n rows costs ceil(n/2) x 8 + floor(n/2) x 16 sectors: Q 1536 + 8, each K or V pass
  // 768 + 768 + 8, two passes of K and V.
  const Problem p = problem_of(1, 1, 129, 128);
  const HierarchyResult r = run("fa2", "forward", p);
  CHECK(r.tiling.async_copy_row_bytes == 272);
  CHECK(r.l2.l2_to_sm_bytes == (1544 + 2 * 2 * 1544) * kSector);
  CHECK(r.two_level.hbm_read_bytes() == (129 + 2 * 2 * 129) * 256);
  // FA2 backward, one head of 256 rows at d 128: 2 key blocks of 128 (K and V: 1536 sectors each),
  // each visiting 4 query blocks of 64 (Q and dO: 768 each; LSE and D: 64 floats, one aligned run
  // into a float array each, 8 sectors).
  const HierarchyResult b = run("fa2", "backward", problem_of(1, 1, 256, 128));
  CHECK(b.l2.l2_to_sm_bytes == 2 * (2 * 1536 + 4 * (2 * 768 + 2 * 8)) * kSector);
  // dK and dV leave as 16-byte pieces (two requests per sector), each (key block, query block)
  // adds a 64 x 128 fp32 tile of dQ (1024 sectors) by a reduction.
  CHECK(b.l2.sm_to_l2_write_sectors == 2 * 256 * (256 / 16));
  CHECK(b.l2.sm_to_l2_reduction_sectors == 2 * 4 * 1024);
  // The Hopper rung's backward writes them as whole rows through shared memory: one request per
  // sector (256 rows x 8 sectors, each of dK and dV).
  CHECK(run("fa3", "backward", problem_of(1, 1, 256, 128)).l2.sm_to_l2_write_sectors == 2 * 256 * (256 / 32));
  // The FA1 rung loads through registers, the Hopper rung by TMA: each sector once.
  for (const auto& [generation, direction, dtype] :
       {std::tuple{"fa1", "forward", DType::fp16}, {"fa3", "forward", DType::bf16}, {"fa3", "backward", DType::bf16}}) {
    INFO(generation << " " << direction);
    const HierarchyResult other = run(generation, direction, problem_of(1, 2, 256, 128, dtype));
    CHECK(other.tiling.async_copy_row_bytes == 0);
    // (The main kernel's reads without a cache count the reductions' fills too.)
    CHECK(other.l2.l2_to_sm_bytes == other.main_read_bytes - other.l2.sm_to_l2_reduction_sectors * kSector);
  }
  // The same 16-bit tiles in the [batch, heads, seqlen, dim] layout: rows contiguous in global
  // memory, still padded in shared memory.
  KernelChoice bhsd{.generation = "fa2", .layout = "bhsd"};
  CHECK(run_hierarchy(bhsd, p, find_machine("h200")).l2.l2_to_sm_bytes == r.l2.l2_to_sm_bytes);
}

TEST_CASE("hierarchy: the FA3 backward at d 128 is modelled on the tiling its launcher takes for the mask",
          "[sim][hierarchy]") {
  CHECK(run("fa3", "backward", problem_of(1, 2, 2048, 128)).tiling.block_rows == 80);
  CHECK(run("fa3", "backward", problem_of(1, 2, 2048, 128, DType::bf16, true)).tiling.block_rows == 64);  // masked variant
  CHECK(run("fa3", "backward", problem_of(1, 2, 2048, 96, DType::bf16, true)).tiling.block_rows == 64);   // pads to 128
  CHECK(run("fa3", "backward", problem_of(1, 1, 8192, 128, DType::bf16, true)).tiling.block_rows == 80);  // long walks
  CHECK(run("fa3", "backward", problem_of(1, 2, 2048, 64, DType::bf16, true)).tiling.block_rows == 128);
}

TEST_CASE("hierarchy: concurrency decides what the L2 catches", "[sim][hierarchy]") {
  // FA2 forward, 4 heads of 1024 rows at d 128: 8 query blocks per head; one head's K and V are
  // 2 x 1024 x 256 B = 512 KB.
  const Problem p = problem_of(1, 4, 1024, 128);
  const std::int64_t kv_head = 2 * 1024 * 256;
  const Counters& c = run("fa2", "forward", p, {.l2_bytes = 0}).two_level;
  const std::int64_t compulsory = tensor_read(c, TensorId::Q) + 4 * kv_head;
  // One block at a time and an L2 of 1.5 heads' K and V: the next block of a head finds them.
  const HierarchyResult one = run("fa2", "forward", p, {.l2_bytes = kv_head * 3 / 2, .l2_partitions = 1, .sm_count = 1, .blocks_per_sm = 1});
  CHECK(one.l2.dram_read_bytes == compulsory);
  // An L2 of half a head's K and V and one block at a time: least recently used always evicts the
  // block read next, so every re-read misses, as the two-level count says.
  const HierarchyResult small = run("fa2", "forward", p, {.l2_bytes = kv_head / 2, .l2_partitions = 1, .sm_count = 1, .blocks_per_sm = 1});
  CHECK(small.l2.dram_read_bytes == c.hbm_read_bytes());
  // The same small L2 with 16 blocks resident (8 SMs x 2), the 8 blocks of a head advancing
  // together: each K_j, V_j comes from DRAM once and serves the other 7 from the L2.
  const HierarchyResult many = run("fa2", "forward", p, {.l2_bytes = kv_head / 2, .l2_partitions = 1, .sm_count = 8, .blocks_per_sm = 2});
  CHECK(many.l2.dram_read_bytes == compulsory);
  CHECK(many.l2.read_hit_bytes == 4 * 7 * kv_head);
  // A large L2 and every block resident: the compulsory traffic.
  const HierarchyResult large = run("fa2", "forward", p, {.l2_bytes = std::int64_t{1} << 30});
  CHECK(large.l2.dram_read_bytes == compulsory);
}

TEST_CASE("hierarchy: equal inputs give identical results", "[sim][hierarchy]") {
  const Problem p = problem_of(2, 4, 777, 64, DType::bf16, true);
  for (const auto& [generation, direction] : {std::pair{"fa2", "forward"}, {"fa2", "backward"}, {"fa3", "forward"}, {"fa3", "backward"}}) {
    INFO(generation << " " << direction);
    const HierarchyResult a = run(generation, direction, p, {.l2_bytes = 1 << 20});
    const HierarchyResult b = run(generation, direction, p, {.l2_bytes = 1 << 20});
    CHECK(a.l2 == b.l2);
    CHECK(a.work.block_steps == b.work.block_steps);
    CHECK(a.two_level == b.two_level);
  }
}

TEST_CASE("hierarchy: the work per thread block follows the schedule and the launch order", "[sim][hierarchy]") {
  // FA2 forward, causal, d 128 (128 x 64 tiles), 1000 rows: 8 query blocks, launched last-first; the
  // block of query block i visits the key blocks up to its last row.
  const Problem p = problem_of(1, 1, 1000, 128, DType::bf16, true);
  const HierarchyResult r = run("fa2", "forward", p);
  REQUIRE(r.work.block_steps.size() == 8);
  for (int x = 0; x < 8; ++x) {
    const int query_block = 7 - x, last_row = std::min(1000, (query_block + 1) * 128) - 1;
    CHECK(r.work.block_steps[static_cast<std::size_t>(x)] == last_row / 64 + 1);
  }
  CHECK(r.work.steps == r.two_level[TensorId::K].hbm_read_elements / (std::int64_t{64} * 128) +
                            (r.two_level[TensorId::K].hbm_read_elements % (64 * 128) != 0));
  // The backward: one block per key block, each visiting the query blocks that see it.
  const HierarchyResult b = run("fa2", "backward", p);
  REQUIRE(b.work.block_steps.size() == 8);  // 1000 keys in blocks of 128
  CHECK(b.work.other_kernels == 2);
  CHECK(b.work.other_kernels_bytes > 0);
  CHECK(b.work.step_matmul_flops == 10.0 * 64 * 128 * 128);
}

TEST_CASE("launch order: each rung's grid, every thread block once", "[sim][hierarchy]") {
  const std::vector<kernels::KernelTiling> tilings = kernels::tilings_for_shared_limit(kernels::kHopperSharedBytes);
  kernels::LaunchShape shape;
  shape.batch = 3, shape.heads_q = shape.heads_kv = 5, shape.seqlen_q = shape.seqlen_k = 1000, shape.head_dim = 128;
  for (const bool causal : {false, true}) {
    shape.causal = causal;
    for (const kernels::KernelTiling& t : tilings) {
      if (t.head_dim != 128) continue;
      INFO(t.generation << " " << t.direction << " causal " << causal);
      const std::vector<kernels::ThreadBlockWork> order = kernels::launch_order(t, shape, 1 << 20);
      std::set<std::tuple<int, int, int>> seen;
      for (const auto& w : order) seen.insert({w.block, w.head, w.batch});
      CHECK(seen.size() == order.size());
      const int rows = t.direction == "forward" ? t.block_rows : t.block_cols;
      CHECK(order.size() == (t.generation == "fa1" ? 1u : static_cast<std::size_t>((1000 + rows - 1) / rows)) * 15);
      if (t.generation == "fa2" && t.direction == "forward") CHECK(order.front().block == (causal ? 7 : 0));
      if (t.generation == "fa3" && t.direction == "forward") {  // tile_order.hpp's order, tile by tile
        const auto tiles = kernels::fa3::forward_tile_order(1000, 1000, 128, 5, 5, 3, causal, t.block_rows);
        for (std::size_t i = 0; i < order.size(); ++i) {
          const auto c = tiles.coordinates(static_cast<int>(i));
          CHECK((order[i] == kernels::ThreadBlockWork{c.m_block, c.head, c.batch}));
        }
      }
    }
  }
  CHECK_THROWS_WITH(kernels::launch_order(tilings.front(), shape, 2), contains_text("allowed: at most 2"));
}

TEST_CASE("time model: waves, overlap, round trips and the bound named", "[sim][time]") {
  const Machine h200 = find_machine("h200");
  KernelTimeConstants c;
  c.tensor_efficiency = 0.5, c.softmax_cycles_per_score = 0.1, c.block_seconds = 1e-6, c.round_trip_seconds = 3e-7;
  // FA2 forward at d 128: two blocks per SM, so softmax and GEMM overlap: the step is the larger.
  const HierarchyResult fa2 = run("fa2", "forward", problem_of(1, 16, 4096, 128));
  const TimePrediction t = predict_time(fa2, h200, c);
  CHECK(fa2.blocks_per_sm == 2);
  const double tensor = 4.0 * 128 * 64 * 128 / (0.5 * h200.gpu->matmul_measured_flops_per_second / 132);
  CHECK(t.step_tensor_seconds == Approx(tensor));
  CHECK(t.step_softmax_seconds == Approx(128 * 64 * 0.1 / h200.gpu->clock_hz));
  CHECK(t.step_seconds == Approx(2 * std::max(t.step_tensor_seconds, t.step_softmax_seconds)));
  // 512 blocks of 64 steps in 264 slots: two waves, the second not full.
  CHECK(t.sm_seconds == Approx(2 * (c.block_seconds + 64 * t.step_seconds)));
  CHECK(t.bound == "tensor");
  // Twice the sequence: four times the steps, and the same slots.
  const TimePrediction t2 = predict_time(run("fa2", "forward", problem_of(1, 16, 8192, 128)), h200, c);
  CHECK(t2.sm_seconds / t.sm_seconds == Approx(4).epsilon(0.05));
  // FA1: its round trips outlast the SM's share of the step.
  const TimePrediction fa1 = predict_time(run("fa1", "forward", problem_of(1, 16, 1024, 128, DType::fp16)), h200, c);
  CHECK(fa1.step_seconds == Approx(66 * c.round_trip_seconds));
  CHECK(fa1.bound == "latency");
  // A slow enough DRAM bounds it.
  Machine slow = h200;
  slow.gpu->copy_bytes_per_second = 1e9;
  CHECK(predict_time(fa2, slow, c).bound == "dram");
  // The preset's calibrated constants exist for every kernel.
  for (const char* key : {"fa1_forward", "fa2_forward", "fa2_backward", "fa3_forward", "fa3_backward"}) {
    CHECK(h200.time_model->kernels.count(key) == 1);
  }
}

TEST_CASE("hierarchy: bad input is refused by name", "[sim][hierarchy]") {
  const Machine h200 = find_machine("h200");
  const Problem p = problem_of(1, 2, 256, 64);
  auto refused = [&](KernelChoice kernel, const Problem& problem, const std::string& text) {
    CHECK_THROWS_WITH(run_hierarchy(kernel, problem, h200), contains_text(text));
  };
  refused({.generation = "fa4"}, p, "kernel 'fa4' is unknown; allowed: fa1, fa2, fa3");
  refused({.generation = "fa2", .direction = "sideways"}, p, "direction 'sideways' is unknown");
  refused({.generation = "fa1", .direction = "backward"}, p, "the fa1 kernel has no backward");
  refused({.generation = "fa1"}, p, "dtype bf16 with the fa1 kernel; allowed: fp16");
  refused({.generation = "fa2", .direction = "forward", .deterministic = true}, p, "allowed: backward kernels only");
  refused({.generation = "fa2", .l2_sections = false}, p, "allowed: the fa3 kernels only");
  refused({.generation = "fa2", .layout = "bshd"}, p, "layout 'bshd' is unknown; allowed: flash, bhsd");
  Problem gqa = p;
  gqa.heads_kv = 1;
  refused({.generation = "fa2", .direction = "backward"}, gqa, "heads_kv = heads_q");
  Problem wide = p;
  wide.head_dim = wide.head_dim_v = 264;
  refused({.generation = "fa3", .direction = "backward"}, wide, "head_dim = 264 has no fa3 backward tiling");
  Problem fp32 = p;
  fp32.dtype = DType::fp32;
  refused({.generation = "fa2"}, fp32, "dtype fp32");
  CHECK_THROWS_WITH(run_hierarchy({}, p, find_machine("h100")), contains_text("machine 'h100' has no \"gpu\""));
  CHECK_THROWS_WITH(run_hierarchy({}, p, h200, {.blocks_per_sm = -1}), contains_text("blocks_per_sm = -1 is out of range"));
  CHECK_THROWS_WITH(run_hierarchy({}, p, h200, {.l2_bytes = -2}), contains_text("l2_bytes = -2 is out of range"));
  CHECK_THROWS_WITH(run_hierarchy({}, p, h200, {.l2_partitions = 65}), contains_text("allowed: 1..64"));
  CHECK_THROWS_WITH(predict_time(run_hierarchy({}, p, h200), find_machine("h100")), contains_text("has no \"time_model\""));
}
