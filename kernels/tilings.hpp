// The tilings the kernels are compiled with, as data: built from the rungs' *_tiling.hpp (the
// same constexpr the kernel templates take their shapes from), in a library that needs no CUDA
// (flashlab_kernel_tilings), so the simulator and the notebooks read the kernels' block sizes
// instead of copying them (`flashlab kernel-tiles`).
#pragma once

#include <string>
#include <vector>

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
};

// Every dispatched tiling: per rung, direction and padded head dim, one per shared budget
// (FA1: Turing's; FA2: an A100's and a Hopper's, where the tiling fits it; the FA2 backward's
// Hopper tiling includes the sm_90 dQ staging tile; FA3, forward and backward: a Hopper's only).
std::vector<KernelTiling> dispatched_tilings();

// The tilings a device allowing `shared_limit` bytes per block runs: for each rung, direction
// and head dim, among those whose min_shared_limit it meets, the one of the widest budget, as the
// launchers pick it; head dims no tiling fits are left out (the host API refuses them there).
std::vector<KernelTiling> tilings_for_shared_limit(int shared_limit);

}  // namespace flashlab::kernels
