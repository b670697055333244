// The GPU's L2 cache as the three-level model sees it (sim/hierarchy.hpp), between the SMs'
// shared memory and DRAM, shared by every SM.
//
// What it holds are units: the sectors one access of a kernel touches (the rows of a tile, each row's
// bytes rounded out to whole sectors), identified by their first sector and their shape. Every
// access of a kernel to a tensor uses that tensor's one tiling, so an access finds its unit whole or
// not at all, and the policy below on units is the policy on the sectors they hold.
//
// The policy:
//   - partitions: the L2 is split into `partitions` equal parts (two on the A100, H100 and H200:
//     NVIDIA's A100 whitepaper, "each L2 partition localizes and caches data for memory accesses from
//     SMs in the GPCs directly connected to the partition"). A unit's home partition follows from its
//     address; an SM reads through its near partition, which keeps a copy of what it reads from the
//     other one. Data that SMs on both sides read is held twice. One partition: a single cache.
//   - least recently used out first within a partition (fully associative; the hardware's sets,
//     hashing and replacement are not modelled);
//   - write-back: a written unit is dirty in its home partition and reaches DRAM when evicted from
//     there; what is still dirty when the kernel ends is reported apart (dirty_at_end_bytes), not as
//     DRAM writes; stores and atomics go to the home partition (a near copy is updated in place);
//   - write-allocate without a fill: a store covers the sectors it writes, so a store that misses
//     reads nothing from DRAM;
//   - an atomic add (a reduction: red, atom, cp.reduce.async.bulk) is performed in the home
//     partition: a missing unit is read from DRAM first, then dirtied, and nothing returns to the
//     SM; its sectors are counted apart from the stores' (Nsight Compute's op_write sectors count
//     stores only, its op_red sectors the reductions);
//   - a read delivers its unit to the SM whether it hits or misses (L2 -> SM bytes, what
//     l1tex__m_xbar2l1tex_read_bytes counts), as many sectors as the SM's requests carry (a
//     cp.async copy can fetch a sector twice, sim/hierarchy.cpp); a miss in the home partition
//     reads it from DRAM;
//   - a unit larger than a partition passes through it and is not kept.
// Capacity is counted in the sectors the units hold (a 128-byte line of which one sector is used
// occupies 32 bytes here; only the 4-byte-per-row tensors, LSE, m, l and D, have such lines).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace flashlab::sim {

// Bytes through the L2 of one kernel run. Plain data; summed with +=.
struct L2Counters {
  std::int64_t dram_read_bytes = 0;     // misses of reads and atomics in the home partition
  std::int64_t dram_write_bytes = 0;    // dirty units evicted while the kernel ran
  std::int64_t dirty_at_end_bytes = 0;  // written and still in the L2 when the kernel ended
  std::int64_t l2_to_sm_bytes = 0;      // every read's sectors, once per request that carries them
  std::int64_t sm_to_l2_write_sectors = 0;      // sectors of the store requests, once per request that writes them
  std::int64_t sm_to_l2_reduction_sectors = 0;  // sectors of the atomics and reductions, likewise
  std::int64_t read_hit_bytes = 0, read_miss_bytes = 0;  // reads found in the near partition, or not
  std::int64_t far_hit_bytes = 0;       // of the misses, found in the home partition (no DRAM read)
  std::int64_t reads = 0, writes = 0, atomics = 0;  // accesses
  L2Counters& operator+=(const L2Counters& other);
  bool operator==(const L2Counters&) const = default;
};

// A unit: the first sector it covers (address / sector size), how many rows and how many sectors
// in all. Two accesses name the same unit iff all three agree.
struct L2UnitKey {
  std::uint64_t first_sector = 0;
  std::uint32_t rows = 0;
  std::uint32_t sectors = 0;
  bool operator==(const L2UnitKey&) const = default;
};

class L2Cache {
 public:
  enum class Access { read, write, atomic };

  // capacity_bytes >= 0 (0: nothing is kept), split evenly over `partitions` >= 1; sector_bytes >= 1.
  L2Cache(std::int64_t capacity_bytes, int sector_bytes, int partitions = 1);
  L2Cache(const L2Cache&) = delete;  // the partitions point at its counters
  L2Cache& operator=(const L2Cache&) = delete;

  // One access to a unit of key.sectors sectors, from an SM near partition `side` (taken modulo the
  // partitions). `request_sectors` is the sectors the SM's requests carry, each counted once per
  // request that carries it (0: the unit's sectors, once): for a read the L2 -> SM traffic, for a
  // write the write sectors (a kernel storing 4-byte floats to alternate halves of a sector writes
  // it twice), for an atomic the reduction sectors. It changes those counters only, never what the
  // L2 holds or what DRAM moves.
  void access(const L2UnitKey& key, Access kind, std::int64_t request_sectors = 0, int side = 0);

  int partitions() const { return static_cast<int>(parts_.size()); }
  int home(const L2UnitKey& key) const;  // the partition a unit's address belongs to
  std::int64_t capacity_bytes() const { return capacity_bytes_; }
  std::int64_t used_bytes() const;
  // The counters so far, with dirty_at_end_bytes the dirty bytes held now.
  L2Counters counters() const;

 private:
  struct KeyHash {
    std::size_t operator()(const L2UnitKey& key) const noexcept;
  };
  // One partition: least recently used first out.
  class Partition {
   public:
    Partition(std::int64_t capacity_bytes, L2Counters& counters) : capacity_bytes_(capacity_bytes), counters_(&counters) {}
    bool touch(const L2UnitKey& key);  // true (and most recent now) if held
    void insert(const L2UnitKey& key, std::int64_t bytes, bool dirty);  // not held before; may evict
    void make_dirty(const L2UnitKey& key);                              // held
    std::int64_t used_bytes = 0, dirty_bytes = 0;

   private:
    struct Unit {
      L2UnitKey key;
      std::int64_t bytes = 0;
      int newer = -1, older = -1;  // the recency list
      bool dirty = false;
    };
    void unlink(int index);
    void push_newest(int index);
    void evict_to_capacity();
    std::int64_t capacity_bytes_;
    L2Counters* counters_;
    std::vector<Unit> units_;
    std::vector<int> free_units_;
    std::unordered_map<L2UnitKey, int, KeyHash> index_;
    int newest_ = -1, oldest_ = -1;
  };

  std::int64_t capacity_bytes_;
  int sector_bytes_;
  L2Counters counters_;
  std::vector<Partition> parts_;
};

}  // namespace flashlab::sim
