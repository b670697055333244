// Where a thread block's work lies along its grid, plain C++ for the exported launch order
// (kernels/tilings.hpp: launch_order), so the simulator walks the blocks in the order the kernels
// take them.
#pragma once

namespace flashlab::kernels {

// The position of block `block_x` of `blocks` along a grid dimension, counted from the far end when
// `reversed`: the FA2 forward visits the query blocks of a causal problem last-first (the heaviest
// start first; forward_kernel.cuh, m_block), the backward rungs in their deterministic mode start
// the last key block first (the key blocks take their turns at dQ from the last down;
// backward_kernel.cuh, key_block). The kernels write the same expression on blockIdx.x themselves:
// routed through this function the compiler schedules their code differently (the FA2 forward's
// d 128 instance, sm_90a), and their measured times are of the code as it is.
constexpr int grid_position(int block_x, int blocks, bool reversed) { return reversed ? blocks - 1 - block_x : block_x; }

}  // namespace flashlab::kernels
