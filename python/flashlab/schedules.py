"""Schedules written in Python on FlashLab's tile-memory interface.

A schedule is a function ``schedule(mem, head, x, *args, **kwargs)`` of one (sequence, query
head): ``mem`` is a memory model (DataMemory or ShapeMemory, the C++ models the built-in
schedules run on), ``head`` the HeadProblem (sizes, scale, mask rules) and ``x`` the HeadTensors
(HBM views Q, K, V, O, LSE). It moves tiles with ``mem.load`` and ``mem.store``, computes on them
with ``mem.matmul_nt``, ``mem.row_max``, ... or the online-softmax helpers, and marks the lines of
its paper's algorithm with ``mem.mark_line``. The same function runs unchanged on every model:

    run(schedule, problem, ...)    every (sequence, head), counted; data runs check against the oracle
    trace(schedule, problem, ...)  one head's events, as the visualizer replays them

A tile holds SRAM from the call that made it until it is freed: ``tile.free()``, ``del tile`` (its
last reference), a ``with`` block, or the schedule's return. Free tiles where a C++ tile would
leave its scope, or the SRAM peak (and a bounded arena) sees them longer. See
docs/python_schedules.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import _core, sim
from .sim import Sram, limits, load_trace, sram_bytes as _sram_bytes
from .sim import _integer
from ._core import (  # noqa: F401  (the interface, re-exported)
    AttentionTensors,
    BlockCoverage,
    Counters,
    DataMemory,
    HbmMatrix,
    HbmScratch,
    HeadProblem,
    HeadTensors,
    Problem,
    Range,
    ShapeMemory,
    SoftmaxState,
    SramOverflow,
    TensorId,
    Tile,
    Trace,
    TraceOverflow,
    TraceRecorder,
    Transpose,
    check_replayable,
    finish_softmax_state,
    head_tensors,
    online_softmax_update,
    random_tensors,
    shape_head_tensors,
    start_softmax_state,
)

__all__ = [
    "AttentionTensors", "BlockCoverage", "Counters", "DataMemory", "HbmMatrix", "HbmScratch", "HeadProblem",
    "HeadTensors", "OracleCheck", "Problem", "Range", "Run", "ShapeMemory", "SoftmaxState", "SramOverflow", "TensorId", "Tile",
    "Trace", "TraceOverflow", "TraceRecorder", "Transpose", "check", "check_replayable", "finish_softmax_state",
    "head_tensors", "load_trace", "online_softmax_update", "random_tensors", "run", "shape_head_tensors",
    "start_softmax_state", "trace",
]

Schedule = Callable[..., Any]

_MEMORY_MODELS = {"data": DataMemory, "shape": ShapeMemory}
_INT64 = (-(2**63), 2**63 - 1)
_UINT64 = (0, 2**64 - 1)


@dataclass
class OracleCheck:
    """A data run against the double-precision oracle, as the simulator's check reports it."""

    schedule: str
    errors: dict  # {"O": max |error|, "LSE": max |error|}
    tolerance: float
    hbm_bytes: int

    @property
    def passed(self) -> bool:
        return all(error <= self.tolerance for error in self.errors.values())


@dataclass
class Run:
    """A schedule run over a whole problem.

    counters: summed over every (sequence, head), the same record as ``flashlab.sim.run(...)
    ["counters"]`` (per tensor HBM traffic, FLOPs, exponentials, SRAM peak, loads, stores).
    tensors: the inputs and outputs of a data run (numpy views: ``run.tensors.O``), else None.
    """

    schedule: str
    problem: Problem
    memory: str
    sram_bytes: int
    counters: dict
    heads_run: int
    tensors: Optional[AttentionTensors] = field(default=None, repr=False)

    def check(self) -> OracleCheck:
        """O and LSE against the oracle (data runs only)."""
        return check(self)

    def compare(self, schedule: str, blocks) -> dict:
        """This run beside a built-in schedule's references, as ``flashlab.sim.run`` reports them
        for that schedule: ``closed_form`` (the exact counters it must produce with these block
        sizes and this run's M), ``closed_form_equal`` (this run's HBM traffic per tensor is that),
        ``bound`` (its IO bound, in elements over the whole problem: infinite when M is unbounded)
        and ``hbm_elements`` (this run's, to set against the bound)."""
        expected = sim.closed_form(schedule, self.problem, blocks, self.sram_bytes)
        bound = dict(sim.bound(schedule, self.problem, self.sram_bytes))
        bound["elements"] *= self.heads_run
        return {"closed_form": expected, "closed_form_equal": expected["tensors"] == self.counters["tensors"],
                "bound": bound, "hbm_elements": self.counters["hbm_elements"]}


def _schedule_name(schedule: Schedule, name: Optional[str]) -> str:
    if name is not None:
        return name
    return getattr(schedule, "__name__", type(schedule).__name__)


def _require_schedule(schedule: Schedule) -> None:
    if not callable(schedule):
        raise TypeError(f"schedule: {schedule!r} is not callable; allowed: a function (mem, head, x, ...)")


def _require_problem(problem: Problem) -> None:
    if not isinstance(problem, Problem):
        raise TypeError(f"problem: {type(problem).__name__}; allowed: a Problem (flashlab.sim.problem(...))")
    problem.validate()


def _memory_model(memory: str):
    try:
        return _MEMORY_MODELS[memory]
    except (KeyError, TypeError):
        raise ValueError(f"memory model {memory!r} is unknown; allowed: data, shape") from None


def _bounded(name: str, value: Any, low: int, high: int) -> int:
    number = _integer(name, value, low, high, _INT64)
    if not low <= number <= high:
        raise ValueError(f"{name} = {number} is out of range; allowed: [{low}, {high}]")
    return number


def _call_head(schedule, mem, head, x, args, kwargs, name):
    """One head of a run; an SRAM overflow keeps the arena's message and notes the head."""
    try:
        schedule(mem, head, x, *args, **kwargs)
    except SramOverflow as error:
        if hasattr(error, "add_note"):
            error.add_note(f"in schedule {name}, batch {head.batch_index}, head {head.head_index}")
        raise


def run(schedule: Schedule, problem: Problem, *args, memory: str = "data", sram: Sram = 0, seed: int = 1,
        tensors: Optional[AttentionTensors] = None, name: Optional[str] = None, **kwargs) -> Run:
    """Runs ``schedule(mem, head, x, *args, **kwargs)`` on every (sequence, query head) of the problem.

    As the C++ whole-problem runner does: a fresh memory model per head (``memory`` "data" or
    "shape"; ``sram`` = M, the SRAM capacity in bytes, an int or text such as "96K", 0 unbounded),
    the counters summed over heads. Data runs draw Q, K, V from ``seed`` as the simulator does, unless ``tensors`` (from
    ``random_tensors(problem)``, inputs set with ``tensors.assign``) are given. A schedule that needs
    more than M raises SramOverflow with the arena's message.
    """
    _require_schedule(schedule)
    _require_problem(problem)
    model = _memory_model(memory)
    sram_bytes = _sram_bytes(sram)
    name = _schedule_name(schedule, name)
    if memory == "shape" and tensors is not None:
        raise ValueError("tensors with memory='shape': a shape-only run has no data; allowed: memory='data'")
    if memory == "data" and tensors is None:
        tensors = random_tensors(problem, _integer("seed", seed, *_UINT64, storage=_UINT64))
    total = Counters()
    heads_run = 0
    for b in range(problem.batch):
        x_shape = shape_head_tensors(problem, b) if memory == "shape" else None
        for h in range(problem.heads_q):
            mem = model(problem.dtype, sram_bytes)
            x = x_shape if x_shape is not None else head_tensors(tensors, problem, b, h)
            _call_head(schedule, mem, problem.head(b, h), x, args, kwargs, name)
            total += mem.counters()
            heads_run += 1
    return Run(schedule=name, problem=problem, memory=memory, sram_bytes=sram_bytes, counters=total.to_dict(),
               heads_run=heads_run, tensors=tensors if memory == "data" else None)


def check(result: Run) -> OracleCheck:
    """The largest errors of a data run's O and LSE against the double-precision oracle, with the
    tolerance the simulator's check (``flashlab.sim.check``) holds the built-in schedules to."""
    if not isinstance(result, Run):
        raise TypeError(f"check: {type(result).__name__}; allowed: the Run that run() returns")
    if result.tensors is None:
        raise ValueError(f"check of {result.schedule}: a {result.memory} run has no outputs; allowed: memory='data'")
    errors, tolerance = _core.oracle_check(result.problem, result.tensors)
    return OracleCheck(schedule=result.schedule, errors=errors, tolerance=tolerance,
                       hbm_bytes=result.counters["hbm_bytes"])


def trace(schedule: Schedule, problem: Problem, *args, blocks: Optional[tuple] = None, sram: Sram = 0, seed: int = 1,
          tensors: Optional[AttentionTensors] = None, name: Optional[str] = None, max_events: int = 1_000_000,
          value_elements: int = 4096, path: Optional[str] = None, **kwargs) -> Trace:
    """Records one head's events as the C++ recorder does: a data run of a one-head problem.

    ``blocks`` = (block_rows, block_cols) is the schedule's tiling, written to the trace's header
    (the visualizer draws its grid and closed form from it); without it, the schedule's keyword
    arguments block_rows and block_cols are taken. ``name`` labels the trace (the
    visualizer shows the pseudocode of a built-in schedule's name, e.g. "fa2"). S and P tiles with
    at most ``value_elements`` elements keep their values. With ``path`` (or ``trace.save(path)``)
    it writes the file ``flashlab_viz --trace path`` replays, as ``flashlab.sim.trace`` does. More
    events than ``max_events`` raise TraceOverflow, never a trace cut short.
    """
    _require_schedule(schedule)
    _require_problem(problem)
    if problem.batch != 1 or problem.heads_q != 1:
        raise ValueError(f"trace: batch {problem.batch}, heads_q {problem.heads_q}; one head only, "
                         "allowed: batch = 1, heads_q = 1")
    if blocks is None and "block_rows" in kwargs and "block_cols" in kwargs:
        blocks = (kwargs["block_rows"], kwargs["block_cols"])
    if blocks is None:
        raise ValueError("trace: blocks not given; allowed: blocks=(block_rows, block_cols), or the schedule's "
                         "block_rows= and block_cols= keywords")
    try:
        block_rows, block_cols = (int(size) for size in blocks)
    except (TypeError, ValueError):
        raise ValueError(f"blocks = {blocks!r}; allowed: (block_rows, block_cols), both >= 1") from None
    if block_rows < 1 or block_cols < 1:
        raise ValueError(f"blocks = {blocks!r}; allowed: (block_rows, block_cols), both >= 1")
    sram_bytes = _sram_bytes(sram)
    name = _schedule_name(schedule, name)
    if tensors is None:
        tensors = random_tensors(problem, _integer("seed", seed, *_UINT64, storage=_UINT64))
    recorder = TraceRecorder(_bounded("max_events", max_events, 1, limits["max_trace_events"]),
                             _bounded("value_elements", value_elements, 0, limits["max_trace_value_elements"]))
    mem = DataMemory(problem.dtype, sram_bytes, recorder)
    _call_head(schedule, mem, problem.head(0, 0), head_tensors(tensors, problem, 0, 0), args, kwargs, name)
    recorded = recorder.finish(name, problem, sram_bytes, block_rows, block_cols)
    if path is not None:
        recorded.save(os.fspath(path))
    return recorded
