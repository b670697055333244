// Ring Attention on a machine (algorithms/12_ring_attention.hpp): each device's HBM traffic, the
// bytes each step sends to the next device, and whether that transfer hides behind the step's
// compute.
//
// A step of the ring computes on the key/value block in hand while the next block travels; it
// lasts as long as the slower of the two. The step's compute time is the roofline time of the
// slowest device's counted work in that step (machines.hpp: the largest of HBM bytes, matmul
// FLOPs, exponentials and other FLOPs over their rates); its link time is the most bytes any
// device sends in the step over the machine's link to the next device (one direction:
// Machine::link_bytes_per_second). The transfer hides when link time <= compute time: the overlap
// condition. The roofline is a peak-rate model (a kernel reaches 60-80% of the matmul peak), so
// the overlap a GPU shows starts at somewhat shorter shards than modelled here.
//
//   RingModel m = model_ring(problem, tiling, /*backward=*/false, find_machine("h200"));
//   m.steps[s].hidden(), m.hidden_link_share(), m.devices[i].hbm_bytes()
//   RingOverlapPoint p = ring_overlap_threshold(shape, tiling, false, machine);   // shortest shard that hides
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "algorithms/12_ring_attention.hpp"
#include "machines.hpp"

namespace flashlab::sim {

struct RingStepTime {
  int step = 0;
  std::vector<int> blocks;       // the block (its owner) each device holds in the step
  std::vector<std::int64_t> device_link_bytes;  // what each device sends to the next in the step
  std::int64_t link_bytes = 0;   // the most one device sends to the next in the step
  double compute_seconds = 0;    // the slowest device's roofline time of its work in the step
  double matmul_seconds = 0;     // the most matmul time (tensor cores at their peak) of a device in the step
  double link_seconds = 0;       // link_bytes over the link's one-direction bandwidth
  int slowest_device = 0;
  bool hidden() const { return link_seconds <= compute_seconds; }
  bool hidden_by_matmul() const { return link_seconds <= matmul_seconds; }
};

struct RingModel {
  Problem problem;
  RingTiling tiling;
  bool backward = false;
  std::string machine;                // its key
  std::vector<Counters> devices;      // each device's counters over the whole problem
  std::vector<std::int64_t> link_bytes_sent;  // each device's, over every step
  std::vector<RingStepTime> steps;    // the whole problem's steps (every head and sequence at once)
  double compute_seconds = 0;         // sum over steps
  double link_seconds = 0;            // sum over steps
  double seconds = 0;                 // sum over steps of max(compute, link): transfers overlapped
  // Of the link time, the share that ran under compute: sum of min(link, compute) / link (1: no link).
  double hidden_link_share() const;
  bool overlapped() const;            // every step hides its transfer behind its roofline time
  bool overlapped_by_matmul() const;  // behind its matmul time alone
};

// The ring's blocks from the machine's SRAM, as the registry derives them for "ring" or
// "ring_backward" (closed_forms.hpp: derive_blocks, the fitting rule; FA2's blocks for shards
// longer than a block).
BlockTiling ring_blocks(const Problem& problem, bool backward, const Machine& machine);

// Models the ring on the machine: one KV group of one sequence is run shape-only and stands for
// every other (a dense batch's units count the same). Throws std::invalid_argument naming the input
// when the machine has no link, the problem is varlen or one the ring refuses, or a count is past
// the run limits.
RingModel model_ring(const Problem& problem, const RingTiling& tiling, bool backward, const Machine& machine);

// The shortest shard (tokens per device, a multiple of `granularity`) at which every step hides
// its transfer, for `devices` devices: the seqlen per device where overlap begins, by two
// measures of a step's compute: its matmul time (the tensor cores at their peak: the block
// compute time against link time of the papers' condition) and its roofline time (which at short
// shards is the step's HBM traffic: the merge's fp32 O, Q and the partials). `shape` gives heads,
// head dims, dtype and mask (its lengths and batch are ignored); blocks are derived per length
// unless the tiling gives them.
struct RingOverlapPoint {
  int devices = 0;
  RingOrdering ordering = RingOrdering::zigzag;
  bool causal = false, backward = false;
  int seqlen_per_device = 0;           // by matmul time; 0: not reached by max_seqlen_per_device
  int roofline_seqlen_per_device = 0;  // by roofline time; 0: not reached
  // The matmul-bound estimate of the same, F e (d + dv) / (2 g B W) tokens: F the matmul rate, e
  // the bytes per element that travel, g query heads per KV head, B the link, W the matmul work
  // per score (d + dv forward, 3d + 2dv backward) times the share of a block pair computed (1/2
  // causal with striped or zig-zag).
  double estimate = 0;
  // At that length, one sequence with the shape's heads: the matmul and link time of the step with
  // the least matmul time per link time.
  double compute_seconds = 0, link_seconds = 0;
};
RingOverlapPoint ring_overlap_threshold(const Problem& shape, const RingTiling& tiling, bool backward, const Machine& machine,
                                        int granularity = 64, int max_seqlen_per_device = 1 << 20);

nlohmann::json to_json(const RingModel& model);
nlohmann::json to_json(const RingOverlapPoint& point);

}  // namespace flashlab::sim
