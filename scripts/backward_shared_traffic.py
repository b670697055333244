#!/usr/bin/env python3
"""Shared-memory bytes of one query block of the FA3 backward's keys-split loop, by operation,
beside the tensor cores' cycles for the same block (kernels/03_fa3_sm90/backward_keys_split.cuh).

One step of the loop: two consumer warpgroups of 64 keys each (a key block of 128), a query block
of M rows, head dim d, 2-byte elements (FA2 Algorithm 2, lines 11-21):
  S^T = K_j Q_i^T and dP^T = V_j dO_i^T   shared-shared wgmma, both operands read from shared memory
  dV += P^T dO_i and dK += dS^T Q_i       register A, B (dO_i, Q_i) from shared memory
  dQ slice = dS K_j                        shared-shared; split by rows (M = 128, each warpgroup 64
                                           query rows) or by columns (each warpgroup d / 2 columns),
                                           or by turns (M = 64: one warpgroup a step issues the
                                           whole 64 x d tile, dS read once; the candidate
                                           docs/bench/patches/fa3_backward_d128_dq_by_turns.patch)
  dS^T stored (stmatrix), the fp32 dQ slices staged and read back by the bulk reduction, Q_i, dO_i,
  LSE_i and D_i written by TMA, LSE_i and D_i read by each warp (one LDS.64 wavefront per 8 rows).
Assumptions, stated so that they can be checked: a wgmma reads its shared operands once per
warpgroup (B is not fetched once per warp), a wavefront moves at most 128 bytes, and an H100/H200
SM moves 128 bytes of shared memory (32 banks of 4 bytes) and 4096 dense bf16 FLOPs per clock.

    python3 scripts/backward_shared_traffic.py --head-dim 128 --query-rows 64 [--json]

Prints a table (bytes per operation, the totals, shared and tensor cycles and their ratio), or
JSON with the same fields. Bad arguments: one line on stderr, exit status 2.
"""
import argparse
import json

import argument_checks

KEY_ROWS = 128            # keys per block: two warpgroups of 64
ELEMENT_BYTES = 2         # bf16 / fp16
SHARED_BYTES_PER_CLOCK = 128
TENSOR_FLOPS_PER_CLOCK = 4096
WAVEFRONT_BYTES = 128
CONSUMER_WARPS = 8


def operations(head_dim, query_rows, dq_split):
    """[(operation, bytes through shared memory, whether they are wgmma operand reads)] for one
    query block of both warpgroups."""
    d, m, e, steps_keys = head_dim, query_rows, ELEMENT_BYTES, KEY_ROWS // 16
    # Per warpgroup and k16 step: A is 64 rows x 16, B is N rows x 16.
    scores = 2 * (d // 16) * 16 * e * (64 + m)                 # S^T (and dP^T): N = M, K = d
    register_a = 2 * (m // 16) * 16 * e * d                    # dV (and dK): B = d x 16 per step
    if dq_split == "rows":                                     # each warpgroup: 64 rows x d
        dq = 2 * steps_keys * 16 * e * (64 + d)
    elif dq_split == "turns":                                  # one warpgroup: 64 rows x d
        dq = steps_keys * 16 * e * (m + d)
    else:                                                      # each warpgroup: M rows x d / 2
        dq = 2 * steps_keys * 16 * e * (m + d // 2)
    rows_reads = CONSUMER_WARPS * 2 * (m // 8) * WAVEFRONT_BYTES
    return [
        ("S^T = K_j Q_i^T (operands)", scores, True),
        ("dP^T = V_j dO_i^T (operands)", scores, True),
        ("dV += P^T dO_i (B)", register_a, True),
        ("dK += dS^T Q_i (B)", register_a, True),
        (f"dQ slice = dS K_j (operands, split by {dq_split})", dq, True),
        ("dS^T stored (stmatrix)", KEY_ROWS * m * e, False),
        ("dQ slices staged (fp32)", m * d * 4, False),
        ("dQ slices read by the bulk reduction", m * d * 4, False),
        ("Q_i, dO_i written by TMA", 2 * m * d * e, False),
        ("LSE_i, D_i written by TMA", 2 * m * 4, False),
        ("LSE_i, D_i read (wavefronts x 128 B)", rows_reads, False),
    ]


def report(head_dim, query_rows, dq_split):
    rows = operations(head_dim, query_rows, dq_split)
    wgmma = sum(b for _, b, operand in rows if operand)
    total = sum(b for _, b, _ in rows)
    flops = 5 * 2 * KEY_ROWS * query_rows * head_dim       # five GEMMs of 128 x M x d
    shared_cycles = total / SHARED_BYTES_PER_CLOCK
    tensor_cycles = flops / TENSOR_FLOPS_PER_CLOCK
    return {
        "head_dim": head_dim, "query_rows": query_rows, "key_rows": KEY_ROWS, "dq_split": dq_split,
        "operations": [{"operation": name, "bytes": b} for name, b, _ in rows],
        "wgmma_operand_bytes": wgmma, "total_bytes": total, "bytes_per_query_row": total / query_rows,
        "flops": flops, "shared_cycles": shared_cycles, "tensor_cycles": tensor_cycles,
        "shared_over_tensor": shared_cycles / tensor_cycles,
    }


def refuse(message):
    argument_checks.refuse("backward_shared_traffic.py", message)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dim", type=int, required=True, help="multiple of 16 in 16..256")
    parser.add_argument("--query-rows", type=int, required=True, help="multiple of 16 in 16..256 (wgmma N)")
    parser.add_argument("--dq-split", choices=["rows", "columns", "turns"],
                        help="how the warpgroups share dQ (default: rows at 128 query rows, else columns)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args()
    if not (16 <= args.head_dim <= 256 and args.head_dim % 16 == 0):
        refuse(f"--head-dim {args.head_dim}: must be a multiple of 16 in 16..256")
    if not (16 <= args.query_rows <= 256 and args.query_rows % 16 == 0):
        refuse(f"--query-rows {args.query_rows}: must be a multiple of 16 in 16..256")
    split = args.dq_split or ("rows" if args.query_rows == 128 else "columns")
    if split == "rows" and args.query_rows != 128:
        refuse(f"--dq-split rows: needs --query-rows 128 (64 rows a warpgroup), got {args.query_rows}")
    if split == "turns" and args.query_rows != 64:
        refuse(f"--dq-split turns: needs --query-rows 64 (one m64 tile), got {args.query_rows}")
    result = report(args.head_dim, args.query_rows, split)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"| d {args.head_dim}, {args.query_rows} query rows x {KEY_ROWS} keys, dQ split by {split} | bytes |")
    print("| --- | --- |")
    for row in result["operations"]:
        print(f"| {row['operation']} | {row['bytes']} |")
    print(f"| wgmma operands | {result['wgmma_operand_bytes']} |")
    print(f"| all | {result['total_bytes']} ({result['bytes_per_query_row']:.0f} a query row) |")
    print(f"\nshared-memory cycles {result['shared_cycles']:.0f} (at {SHARED_BYTES_PER_CLOCK} B a clock), tensor cycles "
          f"{result['tensor_cycles']:.0f} (at {TENSOR_FLOPS_PER_CLOCK} FLOPs a clock): ratio {result['shared_over_tensor']:.2f}")


if __name__ == "__main__":
    main()
