// The tilings the kernels are compiled with, as data: built from the rungs' *_tiling.hpp (the
// same constexpr the kernel templates take their shapes from), in a library that needs no CUDA
// (flashlab_kernel_tilings), so the simulator and the notebooks read the kernels' block sizes
// instead of copying them (`flashlab kernel-tiles`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common/constants.hpp"

namespace flashlab::kernels {

struct KernelTiling {
  std::string generation;  // "fa1", "fa2", "fa3"
  std::string direction;   // "forward", "backward"
  int head_dim = 0;        // the padded head dim of the instance (a head dim runs on the next one up)
  int shared_budget = 0;   // bytes of shared memory per block the tiling was chosen for
  int block_rows = 0;      // query rows per block (B_r)
  int block_cols = 0;      // keys per block (B_c)
  int warps = 0;
  int stages = 0;          // buffers of the streamed tiles: K/V (forward), Q/dO (backward)
  int shared_bytes = 0;    // dynamic shared memory per thread block
  // The least shared memory per block a device must allow to run this tiling: its shared bytes,
  // or, for a variant one architecture takes (the backward's sm_90 dQ staging, taken where a
  // block may use a Hopper's 227 KB), its budget.
  int min_shared_limit = 0;
  // The blocks per SM the kernel's launch bounds ask registers for (its kMinBlocksPerSm): the
  // register budget the compiler holds the kernel to; 0 where the kernel declares none (FA1).
  int min_blocks_per_sm = 0;
  // Bytes per shared-memory row of the 16-bit tiles the kernel copies from global memory with
  // 16-byte cp.async (the padded row pitch; its per-row statistics go to a contiguous float array);
  // 0 where it copies none that way (FA1 loads through registers, the Hopper rung by TMA). Every
  // such tile starts at a 32-byte boundary of shared memory.
  int async_copy_row_bytes = 0;
  // A second tiling of the same instance that a launcher takes under some masks (the FA3
  // backward's d 128 masked variant: 64 query rows instead of 80; takes_masked_variant).
  bool masked_variant = false;
};

// Every dispatched tiling: per rung, direction and padded head dim, one per shared budget
// (FA1: Turing's; FA2: an A100's and a Hopper's, where the tiling fits it; the FA2 backward's
// Hopper tiling includes the sm_90 dQ staging tile; FA3, forward and backward: a Hopper's only).
std::vector<KernelTiling> dispatched_tilings();

// The tilings a device allowing `shared_limit` bytes per block runs: for each rung, direction
// and head dim (and masked variant), among those whose min_shared_limit it meets, the one of the
// widest budget, as the launchers pick it; head dims no tiling fits are left out (the host API
// refuses them there).
std::vector<KernelTiling> tilings_for_shared_limit(int shared_limit);

// Whether a launch of this rung and direction at this padded head dim takes the masked variant
// of its tiling, for the mask's fields (causal, window_left, window_right; -1 unbounded) and the
// longest query sequence (the FA3 backward: fa3::backward_masked_variant).
bool takes_masked_variant(const std::string& generation, const std::string& direction, int padded_head_dim, bool causal,
                          int window_left, int window_right, int seqlen_q);

// The problem as a launch sees it (the fields of algorithms/problem.hpp's Problem that decide the
// grid), and the launch's choices.
struct LaunchShape {
  int batch = 1, heads_q = 1, heads_kv = 1, seqlen_q = 1, seqlen_k = 1, head_dim = 1;
  bool causal = false;
  bool deterministic = false;  // backward: the deterministic dQ order (its key blocks start last-first)
  // fa3 forward, causal: the K and V bytes a section of (head, batch) pairs keeps within
  // (tile_order.hpp; kL2SectionBytes, what fa3_forward launches with).
  long long fa3_l2_section_bytes = kL2SectionBytes;
};

// One thread block's work: its block along the rung's parallel loop (the query block of the FA2
// and FA3 forward, the key block of the backward rungs; 0 for FA1, whose block runs a whole head),
// its head (the query head; the KV head for the backward rungs) and its sequence.
struct ThreadBlockWork {
  int block = 0, head = 0, batch = 0;
  bool operator==(const ThreadBlockWork&) const = default;
};

// The thread blocks of one launch of the tiling's main kernel, in the order the GPU starts them:
// linear block index (x fastest, then y, then z) through each rung's grid (grid_order.hpp,
// tile_order.hpp); a free SM takes the next. Throws std::invalid_argument naming the tiling when
// the launch would exceed `max_blocks` blocks.
std::vector<ThreadBlockWork> launch_order(const KernelTiling& tiling, const LaunchShape& shape, std::int64_t max_blocks);

}  // namespace flashlab::kernels
