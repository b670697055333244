"""The IO simulator from Python: FlashLab's schedules counted by its C++ memory models (sim/),
held against the closed forms and the bounds, with the CLI's records as dicts.

    from flashlab import sim
    problem = sim.problem(seqlen_q=4096, head_dim=128, causal=True, dtype="bf16")
    result = sim.run("fa2", problem, sram="96K")          # result.counters["hbm_bytes"], ...
    points = sim.sweep(["fa1", "fa2"], [1024, 2048, 4096], [64], sram=["96K"])
    pandas.DataFrame(points)                              # one row per point; points.fits
    trace = sim.trace("fa2", sim.problem(seqlen_q=128, head_dim=16), sram="8K")
    trace.save("fa2.json")                                # the visualizer's file
    best = sim.search("fa2", problem, sram="228K", multiple_of=16)["best"]   # the least-traffic tiling
    gpu = sim.hardware("fa2", sim.problem(seqlen_q=16384, head_dim=128, heads_q=16, dtype="bf16"))
    gpu["l2"]["dram_read_bytes"], gpu["time"]["seconds"]   # the kernel's DRAM bytes and time on the H200

Units: SRAM sizes M in bytes (an int, or text with binary K/M suffixes: "96K"); block sizes in
rows; counts in elements and bytes. Bad input raises ValueError naming the input and its allowed
range (the C++ checks and messages); a tile that does not fit in M raises SramOverflow.
"""
from __future__ import annotations

import dataclasses
import json
import operator
import os
from typing import Any, Iterable, Optional, Sequence, Union

from . import _core

Problem = _core.Problem
HeadProblem = _core.HeadProblem
BlockSizes = _core.BlockSizes
BlockCoverage = _core.BlockCoverage
Trace = _core.Trace
SramOverflow = _core.SramOverflow
TraceOverflow = _core.TraceOverflow
limits = dict(_core.limits)

# The machine presets the package carries (sim/machines/*.json of the source tree).
MACHINES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "machines")

Sram = Union[int, str]
Blocks = Union[None, BlockSizes, Sequence[int]]

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_UINT64 = (0, 2**64 - 1)


def _integer(name: str, value: Any, low: int, high: int, storage=_INT32) -> int:
    """value as an int for C++, or ValueError naming it and [low, high]. Values that fit the C++
    type are left to the C++ checks (and their messages); those that do not are refused here."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} = {value!r}; allowed: an integer in [{low}, {high}]") from None
    if not storage[0] <= number <= storage[1]:
        raise ValueError(f"{name} = {number} is out of range; allowed: [{low}, {high}]")
    return number


def _number(name: str, value: Any) -> float:
    try:
        if isinstance(value, bool):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} = {value!r}; allowed: a number") from None


def sram_bytes(sram: Sram, name: str = "sram") -> int:
    """An SRAM size M in bytes: an int, or text such as "96K", "228K", "1M" (binary K and M)."""
    if isinstance(sram, str):
        return _core.parse_bytes(sram, name)
    high = limits["max_sram_bytes"]
    number = _integer(name, sram, 0, high, _INT64)
    if not 0 <= number <= high:
        raise ValueError(f"{name} = {number} is out of range; allowed: [0, {high}]")
    return number


def _preset(key_or_path: str) -> dict:
    return _core.machine(os.fspath(key_or_path), MACHINES_DIR)


def _blocks(blocks: Blocks) -> BlockSizes:
    if blocks is None:
        return BlockSizes()
    if isinstance(blocks, BlockSizes):
        return blocks
    if isinstance(blocks, (str, bytes)) or not hasattr(blocks, "__len__") or len(blocks) not in (2, 3):
        raise ValueError(f"blocks = {blocks!r}; allowed: (block_rows, block_cols) or (block_rows, block_cols, num_splits)")
    high = limits["max_sequence_length"]
    values = [_integer(name, value, 0, high) for name, value in zip(("block_rows", "block_cols", "num_splits"), blocks)]
    for name, value in zip(("block_rows", "block_cols", "num_splits"), values):
        if not 0 <= value <= high:
            raise ValueError(f"{name} = {value} is out of range; allowed: [0, {high}] (0: derived from the SRAM size)")
    return BlockSizes(*values)


# ---------------------------------------------------------------------------------------------
# Problems


def problem(seqlen_q: int = 1024, head_dim: int = 64, *, seqlen_k: Optional[int] = None, batch: int = 1,
            heads_q: int = 1, heads_kv: Optional[int] = None, head_dim_v: int = 0, causal: bool = False,
            alignment: str = "bottom_right", window_left: int = -1, window_right: int = -1,
            softmax_scale: float = 0.0, softcap: float = 0.0, alibi_slopes: Optional[Iterable[float]] = None,
            dropout_p: float = 0.0, dropout_seed: int = 0, dropout_offset: int = 0, dtype: str = "fp32",
            seqlens_q: Optional[Sequence[int]] = None, seqlens_k: Optional[Sequence[int]] = None,
            block_mask: Optional[tuple] = None) -> Problem:
    """A validated attention problem (algorithms/problem.hpp), with the C++ field names.

    seqlen_k and heads_kv default to seqlen_q and heads_q; head_dim_v 0 means head_dim;
    softmax_scale 0 means 1 / sqrt(head_dim). seqlens_q and seqlens_k (together) make a varlen
    batch of those lengths. block_mask = (block_rows, block_cols, keep), keep a list of rows of
    0/1, one per block of queries, is block sparsity. Raises ValueError naming a bad input."""
    p = Problem()
    max_seq, max_heads, max_dim = limits["max_sequence_length"], limits["max_heads"], limits["max_head_dim"]
    p.batch = _integer("batch", batch, 1, limits["max_batch"])
    p.heads_q = _integer("heads_q", heads_q, 1, max_heads)
    p.heads_kv = _integer("heads_kv", heads_q if heads_kv is None else heads_kv, 1, p.heads_q)
    p.seqlen_q = _integer("seqlen_q", seqlen_q, 1, max_seq)
    p.seqlen_k = _integer("seqlen_k", seqlen_q if seqlen_k is None else seqlen_k, 1, max_seq)
    p.head_dim = _integer("head_dim", head_dim, 1, max_dim)
    p.head_dim_v = _integer("head_dim_v", head_dim_v, 0, max_dim)
    p.causal = bool(causal)
    p.alignment = alignment
    window_limit = max(p.seqlen_q, p.seqlen_k)
    p.window_left = _integer("window_left", window_left, -1, window_limit)
    p.window_right = _integer("window_right", window_right, -1, window_limit)
    p.softmax_scale = _number("softmax_scale", softmax_scale)
    p.softcap = _number("softcap", softcap)
    if alibi_slopes is not None:
        p.alibi_slopes = [_number(f"alibi_slopes[{i}]", s) for i, s in enumerate(alibi_slopes)]
    p.dropout_p = _number("dropout_p", dropout_p)
    p.dropout_seed = _integer("dropout_seed", dropout_seed, *_UINT64, storage=_UINT64)
    p.dropout_offset = _integer("dropout_offset", dropout_offset, *_UINT64, storage=_UINT64)
    p.dtype = dtype
    if (seqlens_q is None) != (seqlens_k is None):
        raise ValueError("seqlens_q and seqlens_k: allowed: both (one length per sequence) or neither")
    if seqlens_q is not None:
        lengths = [[_integer(f"{name}[{i}]", n, 1, max_seq) for i, n in enumerate(values)]
                   for name, values in (("seqlens_q", seqlens_q), ("seqlens_k", seqlens_k))]
        p.set_varlen(*lengths)
    if block_mask is not None:
        if not isinstance(block_mask, (tuple, list)) or len(block_mask) != 3:
            raise ValueError(f"block_mask = {block_mask!r}; allowed: (block_rows, block_cols, keep)")
        block_rows, block_cols, keep = block_mask
        p.block_rows = _integer("block_mask block_rows", block_rows, 1, max_seq)
        p.block_cols = _integer("block_mask block_cols", block_cols, 1, max_seq)
        rows = [list(row) for row in keep]
        p.row_blocks = len(rows)
        p.col_blocks = len(rows[0]) if rows else 0
        if any(len(row) != p.col_blocks for row in rows):
            raise ValueError(f"block_mask keep: rows of {sorted({len(r) for r in rows})} entries; allowed: one length")
        p.block_keep = [1 if value else 0 for row in rows for value in row]
    p.validate()
    return p


def default_check_problem() -> Problem:
    """The main job's check problem: batch 2, heads 4/2 (GQA), N 113 x 203, d 59, fp32."""
    return _core.default_check_problem()


def _problem_repr(p: Problem) -> str:
    fields = ["batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "head_dim_v", "dtype", "causal"]
    return "Problem(" + ", ".join(f"{name}={getattr(p, name)!r}" for name in fields) + ")"


Problem.__repr__ = _problem_repr


# ---------------------------------------------------------------------------------------------
# The registry, runs and checks


def schedules() -> list:
    """Every registered schedule: {name, source, paper, description, pass, tiled}, in learning order."""
    return _core.schedules()


def schedule_names() -> list:
    return [s["name"] for s in _core.schedules()]


@dataclasses.dataclass(frozen=True)
class RunResult:
    """One run: the counters summed over every (sequence, head), in the CLI's JSON schema
    (sim/report.hpp: hbm_bytes, hbm_read_bytes, ..., tensors: {"Q": {read_elements, ...}}),
    the closed form of the same run, the schedule's bound (elements, whole problem) and, with a
    machine, the roofline time."""
    schedule: str
    memory: str
    sram_bytes: int
    blocks: dict
    heads_total: int
    heads_run: int
    counters: dict
    closed_form: dict
    closed_form_equal: bool
    bound: dict
    machine: Optional[str] = None
    roofline: Optional[dict] = None
    block_rule: str = "fitting"  # how the blocks came: "given", "fitting" or "paper"
    arena_bytes: int = 0         # the SRAM arena of the run: M, or the paper rule's working set
    serving: Optional[dict] = None  # decode runs: KV bytes per generated token, page-table bytes, ...

    def record(self) -> dict:
        """A flat dict (a DataFrame row): the scalar counters, blocks, bound, serving metrics and roofline."""
        row = {"schedule": self.schedule, "memory": self.memory, "sram_bytes": self.sram_bytes, **self.blocks}
        row.update({k: v for k, v in self.counters.items() if k != "tensors"})
        row.update({"bound_" + k: v for k, v in self.bound.items()})
        row["closed_form_equal"] = self.closed_form_equal
        if self.serving:
            row.update({"serving_" + k: v for k, v in self.serving.items()})
        if self.roofline:
            row["machine"] = self.machine
            row.update({"roofline_" + k: v for k, v in self.roofline.items()})
        return row


def _run_sram(sram: Optional[Sram], blocks: BlockSizes, machine: Optional[str]) -> int:
    if sram is not None:
        return sram_bytes(sram)
    if machine:
        return _preset(machine)["sram_bytes"]
    if blocks.block_rows > 0 or blocks.block_cols > 0:
        return 0
    raise ValueError("sram: give the SRAM size (sram=\"228K\"), a machine, or blocks=(block_rows, block_cols)")


def _given_blocks(blocks: Blocks) -> BlockSizes:
    b = _blocks(blocks)
    if (b.block_rows > 0) != (b.block_cols > 0):  # one given: the other the same, as the CLI does
        side = max(b.block_rows, b.block_cols)
        b = BlockSizes(side, side, b.num_splits)
    return b


def run(schedule: str, problem: Problem, *, sram: Optional[Sram] = None, blocks: Blocks = None,
        machine: Optional[str] = None, memory: str = "shape", seed: int = 1, every_head: bool = False,
        block_rule: str = "fitting", page_size: int = 0, page_reads: str = "valid_rows",
        dkv_reduction: str = "fp32_partials") -> RunResult:
    """Runs a schedule on a problem with a memory model ("shape": shapes only, O(tiles); "data":
    real values) and returns its counters. Block sizes are derived from the SRAM size M unless
    given (then M only bounds the arena; 0 = unbounded); M defaults to the machine preset's.
    block_rule: "fitting" (the paper's shape shrunk until the working set fits M) or "paper" (the
    paper's rule as written; the arena grows to its working set); the result says which ran.
    page_size (split_kv only): a paged KV cache of that many tokens per page (0: contiguous), whose
    block table's reads are counted as the tensor "page_table"; page_reads: "valid_rows" (a key
    block reads only its own rows, as FlashAttention's paged kernels) or "whole_pages" (every page it
    touches, in full, as vLLM's paged attention). Decode runs carry `serving`: KV bytes per
    generated token, page-table bytes, HBM bytes per token per layer (docs/simulator.md).
    dkv_reduction (backward passes with GQA/MQA): "fp32_partials" (fp32 dK, dV per query head,
    then a reduction pass) or "in_place" (one fp32 accumulator per KV head, added into with
    atomics, converted once)."""
    b = _given_blocks(blocks)
    m = _run_sram(sram, b, machine)
    if page_reads not in ("valid_rows", "whole_pages"):
        raise ValueError(f"page_reads = {page_reads!r}; allowed: 'valid_rows', 'whole_pages'")
    record = _core.run(schedule, problem, memory, m, b, _integer("seed", seed, *_UINT64, storage=_UINT64),
                       bool(every_head), machine or "", MACHINES_DIR, str(block_rule),
                       _integer("page_size", page_size, 0, 1 << 16), str(page_reads), str(dkv_reduction))
    return RunResult(**record)


def check(schedule: str, problem: Optional[Problem] = None, *, sram: Sram = "64K", seed: int = 2024) -> dict:
    """Runs a schedule on random data and compares it with the double-precision oracle:
    {schedule, paper, blocks, errors: {"O": ..., "LSE": ...}, hbm_bytes, tolerance, passed}."""
    p = default_check_problem() if problem is None else problem
    return _core.check(schedule, p, sram_bytes(sram), _integer("seed", seed, *_UINT64, storage=_UINT64))


# ---------------------------------------------------------------------------------------------
# Sweeps


class Sweep(list):
    """The points of a sweep as flat records (a list of dicts: pandas.DataFrame(sweep) is one row
    per point), with the fitted exponents in .fits and the CLI's whole JSON in .to_json()."""

    def __init__(self, result: dict):
        super().__init__(_flat_point(p) for p in result["points"])
        self.fits = result["fits"]
        self._json = result

    def to_json(self) -> dict:
        """The sweep in the CLI's schema (docs/schemas/sweep.schema.json: format flashlab-sweep, version 1)."""
        return self._json

    def save(self, path: str) -> None:
        with open(path, "w") as file:
            json.dump(self._json, file, indent=1)
            file.write("\n")


def _flat_point(point: dict) -> dict:
    row = {k: v for k, v in point.items() if k not in ("bound", "roofline")}
    for part in ("bound", "roofline"):
        for key, value in point.get(part, {}).items():
            row[f"{part}_{key}"] = value
    return row


def _list(name: str, values: Any) -> list:
    if isinstance(values, (str, int)):
        return [values]
    try:
        return list(values)
    except TypeError:
        raise ValueError(f"{name} = {values!r}; allowed: a value or a list of them") from None


def sweep(schedules: Union[str, Sequence[str]], seqlens: Union[int, Sequence[int]],
          head_dims: Union[int, Sequence[int]], sram: Union[None, Sram, Sequence[Sram]] = None, *,
          masks: Union[str, Sequence[str]] = "none", dtype: Optional[str] = None, batch: int = 1, heads: int = 1,
          machine: Optional[str] = None, jobs: int = 1, block_rule: str = "fitting") -> Sweep:
    """Counts every point of the grid schedules x seqlens (N) x head_dims (d) x sram (M) x masks
    shape-only, with its bound and (with a machine) its roofline time, and fits the log-log
    exponents along N, M and d. Masks: "none", "causal", "window:W", "sparse:S". M defaults to
    the machine's, dtype to the machine's, else bf16. "all" is every schedule. jobs: threads
    counting the points (the result is the serial one, in the same order). block_rule: how each
    point's blocks come from its M, as in run() ("fitting" or "paper")."""
    names = schedule_names() if schedules == "all" else _list("schedules", schedules)
    n = [_integer(f"seqlens[{i}]", v, 1, limits["max_sweep_seqlen"]) for i, v in enumerate(_list("seqlens", seqlens))]
    d = [_integer(f"head_dims[{i}]", v, 1, limits["max_sweep_head_dim"])
         for i, v in enumerate(_list("head_dims", head_dims))]
    preset = _preset(machine) if machine else None
    if sram is None:
        if preset is None:
            raise ValueError("sram: give the SRAM sizes (sram=[\"16K\", \"96K\"]) or a machine")
        sizes = [preset["sram_bytes"]]
    else:
        sizes = [sram_bytes(s, f"sram[{i}]") for i, s in enumerate(_list("sram", sram))]
    dtype = dtype or (preset["dtype"] if preset else "bf16")
    threads = _integer("jobs", jobs, 1, limits["max_sweep_jobs"])
    command = (f"flashlab.sim.sweep({names!r}, {n!r}, {d!r}, sram={sizes!r}, masks={_list('masks', masks)!r}, "
               f"dtype={dtype!r}, batch={batch!r}, heads={heads!r}, machine={machine!r}"
               + (f", jobs={threads!r}" if threads != 1 else "")
               + (f", block_rule={block_rule!r})" if block_rule != "fitting" else ")"))
    result = _core.sweep(names, n, d, sizes, _list("masks", masks), dtype, _integer("batch", batch, 1, limits["max_batch"]),
                         _integer("heads", heads, 1, limits["max_heads"]), machine or "", MACHINES_DIR, command,
                         threads, str(block_rule))
    return Sweep(result)


# ---------------------------------------------------------------------------------------------
# Mapping search


def search(schedules: Union[str, Sequence[str]], problem: Problem, *, sram: Optional[Sram] = None,
           machine: Optional[str] = None, objective: str = "hbm", multiple_of: int = 1, max_rows: int = 0,
           max_cols: int = 0, square: bool = False, registers_per_thread: int = 0, threads_per_block: int = 128,
           splits: int = 0, exhaustive: bool = False, max_tile_steps: Optional[int] = None) -> dict:
    """The block sizes (Br, Bc) of M with the least HBM traffic (objective="hbm") or roofline
    time on a machine (objective="time"), costed by the closed forms: the best, the Pareto front
    of the objective against the working set, where the fitting and the paper rules land on it
    (rank, on_front, ratio_to_best), the best run through the real schedule in an arena of M
    (verification), and search_seconds. Constraints: Br, Bc multiples of multiple_of, at most
    max_rows / max_cols (0: no limit), square blocks, and a register budget of
    registers_per_thread fp32 accumulator elements (S_ij and the output tile) per thread of
    threads_per_block (0: none). Several schedules of one pass compare loop orders ("fa1,fa2").
    M defaults to the machine's. max_tile_steps: the closed-form work spent at most (default
    the C++ kMaxSearchTileSteps; past it tilings are pruned by a bound or skipped, and the record
    says so in best_exact and front_complete). The record follows docs/schemas/search.schema.json."""
    names = [s for s in schedules.split(",") if s] if isinstance(schedules, str) else _list("schedules", schedules)
    if sram is None:
        if not machine:
            raise ValueError("sram: give the SRAM size (sram=\"228K\") or a machine")
        m = _preset(machine)["sram_bytes"]
    else:
        m = sram_bytes(sram)
    high = limits["max_sequence_length"]
    command = (f"flashlab.sim.search({names!r}, sram={m!r}, machine={machine!r}, objective={objective!r}, "
               f"multiple_of={multiple_of!r}, max_rows={max_rows!r}, max_cols={max_cols!r}, square={square!r}, "
               f"registers_per_thread={registers_per_thread!r}, threads_per_block={threads_per_block!r})")
    return _core.search(names, problem, m, str(objective), _integer("multiple_of", multiple_of, 1, 1 << 16),
                        _integer("max_rows", max_rows, 0, high), _integer("max_cols", max_cols, 0, high), bool(square),
                        _integer("registers_per_thread", registers_per_thread, 0, 1 << 16),
                        _integer("threads_per_block", threads_per_block, 1, 1 << 16), _integer("splits", splits, 0, high),
                        bool(exhaustive), machine or "", MACHINES_DIR, command,
                        *([] if max_tile_steps is None else [_integer("max_tile_steps", max_tile_steps, 1, 2**40, _INT64)]))


# ---------------------------------------------------------------------------------------------
# Traces


def trace(schedule: str, problem: Problem, *, sram: Optional[Sram] = None, blocks: Blocks = None,
          machine: Optional[str] = None, max_events: int = 1_000_000, value_elements: int = 4096, seed: int = 1,
          path: Optional[str] = None) -> Trace:
    """Records one head's events (batch 1, heads 1) from a data run: trace.info (the header),
    trace.events (dicts: kind, tensor, row_begin, row_count, col_begin, col_count, op, line,
    sram_bytes, bytes; softmax updates add row_max, row_sum, rescale; S and P tiles up to
    value_elements elements add values). With path (or trace.save(path)) it writes the
    visualizer's trace file. More events than max_events raise TraceOverflow: never cut short."""
    b = _given_blocks(blocks)
    m = _run_sram(sram, b, machine)
    recorded = _core.trace(schedule, problem, m, b, _integer("max_events", max_events, 1, limits["max_trace_events"], _INT64),
                           _integer("value_elements", value_elements, 0, limits["max_trace_value_elements"], _INT64),
                           _integer("seed", seed, *_UINT64, storage=_UINT64))
    if path is not None:
        recorded.save(os.fspath(path))
    return recorded


def load_trace(path: str) -> Trace:
    """Reads and checks a trace file (the visualizer's format)."""
    return _core.load_trace(os.fspath(path))


# ---------------------------------------------------------------------------------------------
# Machines


def ring(problem: Problem, *, devices: int = 8, ordering: str = "zigzag", backward: bool = False,
         machine: str = "h200", blocks: Blocks = None) -> dict:
    """Ring Attention on a machine, as `flashlab ring` models it (sim/ring.hpp): the sequence of
    `problem` (seqlen_q = seqlen_k = devices x the shard) split over `devices` devices by `ordering`
    ("contiguous", "striped", "zigzag"); each device's counters, and per step the block each device
    holds, the link bytes and times, the compute (roofline and matmul) times and whether the
    transfer hides; totals, the hidden share of the link time, the overlap condition. Blocks inside
    a device derive from the machine's SRAM unless given."""
    b = _given_blocks(blocks)
    return _core.ring_model(problem, _integer("devices", devices, 1, limits["max_ring_devices"]), str(ordering),
                            bool(backward), b.block_rows, b.block_cols, machine, MACHINES_DIR)


def ring_overlap(problem: Problem, devices: Union[int, Sequence[int]] = (2, 4, 8), *, ordering: str = "zigzag",
                 machine: str = "h200", granularity: int = 64) -> list:
    """Where a ring's overlap begins, as `flashlab ring --sweep`: for each number of devices, forward
    and backward, the shortest seqlen per device (a multiple of `granularity`) at which every step's
    transfer takes no longer than its matmul time (seqlen_per_device) and than its roofline time
    (roofline_seqlen_per_device), with the matmul-bound estimate. `problem` gives heads, head dims,
    dtype and mask; its lengths are ignored."""
    points = []
    for p in _list("devices", devices):
        for backward in (False, True):
            points.append(_core.ring_overlap(problem, _integer("devices", p, 1, limits["max_ring_devices"]), str(ordering),
                                             backward, machine, MACHINES_DIR,
                                             _integer("granularity", granularity, 1, 1 << 20)))
    return points


def machines() -> list:
    """The machine presets the package carries, sorted by key: dicts with key, name, dtype,
    sram_bytes, hbm_bytes_per_second, matmul_flops_per_second, exp_per_second,
    fp32_flops_per_second and the source of each."""
    return _core.machines(MACHINES_DIR)


def machine(key_or_path: str) -> dict:
    """A preset by key ("h200") or a path to a preset .json."""
    return _preset(key_or_path)


def kernel_tilings(machine: Optional[str] = None, generation: Optional[str] = None,
                   direction: Optional[str] = None) -> list:
    """The GPU kernels' compiled tilings (block sizes, warps, stages, shared memory): all of
    them, or those that the machine's shared memory per block runs; optionally one generation
    ("fa1", "fa2", "fa3") and direction ("forward", "backward")."""
    tilings = _core.kernel_tilings(machine or "", MACHINES_DIR)
    for name, value in (("generation", generation), ("direction", direction)):
        allowed = sorted({t[name] for t in tilings})
        if value is not None and value not in allowed:
            raise ValueError(f"{name} '{value}' is unknown; allowed: {', '.join(allowed)}")
    return [t for t in tilings if (generation is None or t["generation"] == generation)
            and (direction is None or t["direction"] == direction)]


# ---------------------------------------------------------------------------------------------
# The GPU kernels through the three-level model (sim/hierarchy.hpp) and the time model


def hardware_run(kernel: str, problem: Problem, *, direction: str = "forward", machine: str = "h200",
                 deterministic: bool = False, l2_sections: bool = True, layout: str = "flash", l2: Optional[Sram] = None,
                 l2_partitions: int = 0, sm_count: int = 0, blocks_per_sm: int = 0) -> "_core.HardwareRun":
    """The kernel ("fa1", "fa2", "fa3"; direction "forward" or "backward") on the problem, through
    the L2 shared by the machine's resident thread blocks: an object whose record() is the result
    (`flashlab hardware --json`) and whose time(constants) asks the time model with other
    constants (the calibration's). layout: "flash" ([batch * seqlen, heads, dim], as the benchmark
    binaries Nsight Compute profiles) or "bhsd" ([batch, heads, seqlen, dim], as
    scripts/bench_kernels.py passes PyTorch's tensors). l2, l2_partitions, sm_count and
    blocks_per_sm replace the machine's (None or 0: the machine's)."""
    for name, value in (("kernel", kernel), ("direction", direction), ("machine", machine), ("layout", layout)):
        if not isinstance(value, str):
            raise ValueError(f"{name} = {value!r}; allowed: a string")
    l2_bytes = -1 if l2 is None else sram_bytes(l2, "l2")
    return _core.hardware(kernel, direction, problem, machine, MACHINES_DIR, bool(deterministic), bool(l2_sections),
                          layout, l2_bytes, _integer("l2_partitions", l2_partitions, 0, 64),
                          _integer("sm_count", sm_count, 0, 1 << 16), _integer("blocks_per_sm", blocks_per_sm, 0, 1024))


def hardware(kernel: str, problem: Problem, **options) -> dict:
    """hardware_run(...).record(): DRAM read and write bytes, L2 -> SM bytes, occupancy and waves,
    and the predicted time with the bound it names ("dram", "l2", "tensor", "exp", "latency")."""
    return hardware_run(kernel, problem, **options).record()


# ---------------------------------------------------------------------------------------------
# Closed forms and bounds


def closed_form(schedule: str, problem: Problem, blocks: Blocks, sram: Sram = 0) -> dict:
    """The exact counters a schedule must produce on the whole problem with these block sizes
    (sim/closed_forms.hpp), in the run's counters schema (other_flops and sram_peak_bytes 0)."""
    return _core.closed_form(schedule, problem, _blocks(blocks), sram_bytes(sram))


def derive_blocks(schedule: str, problem: Problem, sram: Sram) -> BlockSizes:
    """The block sizes the schedule's rule derives from M (the paper's, shrunk until they fit)."""
    return _core.derive_blocks(schedule, problem, sram_bytes(sram))


def working_set_bytes(schedule: str, problem: Problem, blocks: Blocks) -> int:
    """The SRAM the schedule holds at its peak with these block sizes (unmasked), in bytes."""
    return _core.working_set_bytes(schedule, problem, _blocks(blocks))


def bound(schedule: str, problem: Problem, sram: Sram, sparsity: float = 1.0) -> dict:
    """The bound the schedule's count is held against, per (sequence, head): {formula, source,
    elements}, and warning when M is outside the range d <= M <= N d the bound is proved for."""
    return _core.schedule_bound(schedule, problem, sram_bytes(sram), _number("sparsity", sparsity))


def lower_bound(problem: Problem, sram: Sram) -> dict:
    """Saha and Ye's lower bound (FA1 Proposition 3 for M >= d^2), per (sequence, head), never below
    the compulsory traffic (Q, K, V read once, O written once); warning outside d <= M <= N d."""
    return _core.lower_bound(problem, sram_bytes(sram))


def bound_formulas(problem: Problem, sram: Sram, sparsity: float = 1.0) -> dict:
    """Every bound formula of sim/bounds.hpp at this problem and M, in elements per head:
    standard, flash, block_sparse, saha_ye_lower, compulsory, memory_efficient, square_tiling."""
    return _core.bound_formulas(problem, sram_bytes(sram), _number("sparsity", sparsity))


def theory_exponents(schedule: str, m_elements: float, head_dim: float) -> dict:
    """The exponents of traffic in N, M and d the theory predicts in the regime of (M, d)."""
    return _core.theory_exponents(schedule, _number("m_elements", m_elements), _number("head_dim", head_dim))


def human_bytes(count: float) -> str:
    """1.23 GB, 456 KB (decimal units, as the papers use)."""
    return _core.human_bytes(_number("bytes", count))
