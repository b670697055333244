"""flashlab.schedules: a schedule written in Python runs on the C++ memory models.

FA2's forward written in Python (flashlab/examples/fa2_forward.py) is held to two oracles it
does not share code with: the C++ fa2 schedule run by the simulator (counters, SRAM overflow,
trace, event by event) and the closed form of its traffic; its outputs are held to the
double-precision oracle. Bad input raises ValueError or TypeError with a message naming it.
"""

import math
import re

import numpy as np
import pytest

from flashlab import schedules, sim
from flashlab.examples.fa2_forward import fa2_forward, online_softmax_update_in_python
from flashlab.examples.standard_attention import standard_attention
from flashlab.schedules import BlockCoverage, DataMemory, Range, ShapeMemory, TensorId, Transpose

# Problems over the official tests' odd shapes and every kind of mask; (block_rows, block_cols)
# chosen so that no size is a multiple of a block.
PROBLEMS = {
    "gqa_113x203_d59": (dict(seqlen_q=113, seqlen_k=203, head_dim=59, batch=2, heads_q=4, heads_kv=2), (32, 48)),
    "causal_128x217_d40": (dict(seqlen_q=128, seqlen_k=217, head_dim=40, causal=True), (48, 32)),
    "causal_top_left_217x128": (dict(seqlen_q=217, seqlen_k=128, head_dim=16, causal=True, alignment="top_left"),
                                (40, 24)),
    "window_200_d32": (dict(seqlen_q=200, seqlen_k=200, head_dim=32, window_left=37, window_right=5, heads_q=2),
                       (32, 32)),
    "causal_window_mqa": (dict(seqlen_q=150, seqlen_k=190, head_dim=24, causal=True, window_left=50, heads_q=3,
                               heads_kv=1), (16, 40)),
    "one_key_239x1": (dict(seqlen_q=239, seqlen_k=1, head_dim=16), (64, 64)),
    "one_by_one": (dict(seqlen_q=1, seqlen_k=1, head_dim=8), (64, 64)),
    "varlen_causal": (dict(seqlens_q=[5, 77, 130], seqlens_k=[9, 60, 131], head_dim=20, causal=True, heads_q=2),
                      (32, 16)),
    "softcap_alibi": (dict(seqlen_q=70, seqlen_k=90, head_dim=16, softcap=5.0, alibi_slopes=[0.25, 0.0], heads_q=2),
                      (32, 32)),
    "block_sparse": (dict(seqlen_q=96, seqlen_k=128, head_dim=16,
                          block_mask=(32, 32, [[1, 0, 1, 0], [0, 1, 0, 0], [1, 1, 1, 1]])), (16, 48)),
    "dropout": (dict(seqlen_q=64, seqlen_k=80, head_dim=16, dropout_p=0.2, dropout_seed=7), (32, 32)),
    "bf16_head_dim_v": (dict(seqlen_q=100, seqlen_k=130, head_dim=40, head_dim_v=24, dtype="bf16"), (32, 64)),
    "fp16_causal": (dict(seqlen_q=120, seqlen_k=120, head_dim=32, causal=True, dtype="fp16"), (32, 48)),
}


def make(name):
    fields, blocks = PROBLEMS[name]
    return sim.problem(**fields), blocks


def cpp_fa2(problem, blocks, memory="shape", sram=0):
    return sim.run("fa2", problem, blocks=blocks, sram=sram, memory=memory, every_head=True)


@pytest.mark.parametrize("name", PROBLEMS)
def test_python_fa2_counts_what_the_cpp_fa2_counts(name):
    problem, (br, bc) = make(name)
    cpp = cpp_fa2(problem, (br, bc))
    for memory in ("data", "shape"):
        run = schedules.run(fa2_forward, problem, block_rows=br, block_cols=bc, memory=memory)
        assert run.counters == cpp.counters, memory
        assert run.heads_run == cpp.heads_total
    # The online-softmax update written out op by op counts the same as the C++ helper.
    by_hand = schedules.run(fa2_forward, problem, block_rows=br, block_cols=bc, update=online_softmax_update_in_python)
    assert by_hand.counters == cpp.counters


@pytest.mark.parametrize("name", PROBLEMS)
def test_python_fa2_traffic_is_the_closed_form(name):
    problem, (br, bc) = make(name)
    run = schedules.run(fa2_forward, problem, block_rows=br, block_cols=bc, memory="shape")
    expected = sim.closed_form("fa2", problem, (br, bc))
    assert run.counters["tensors"] == expected["tensors"]
    assert run.counters["hbm_bytes"] == expected["hbm_bytes"]


@pytest.mark.parametrize("sram", [0, "64K"])
def test_a_run_compared_with_a_built_in_schedule_is_what_the_simulator_reports(sram):
    problem, blocks = make("gqa_113x203_d59")
    run = schedules.run(fa2_forward, problem, *blocks, memory="shape", sram=sram)
    built_in = sim.run("fa2", problem, blocks=blocks, sram=sram, every_head=True)
    compared = run.compare("fa2", blocks)
    assert compared["closed_form"] == built_in.closed_form
    assert compared["closed_form_equal"] is built_in.closed_form_equal is True
    assert compared["bound"] == built_in.bound
    assert compared["hbm_elements"] == built_in.counters["hbm_elements"]
    # Against another schedule's closed form the traffic differs.
    assert run.compare("fa1", blocks)["closed_form_equal"] is False


@pytest.mark.parametrize("name", PROBLEMS)
def test_python_fa2_matches_the_oracle(name):
    problem, (br, bc) = make(name)
    run = schedules.run(fa2_forward, problem, block_rows=br, block_cols=bc, seed=11)
    result = run.check()
    assert result.passed, result
    assert set(result.errors) == {"O", "LSE"}
    assert result.tolerance == sim.check("fa2", problem, sram="64K")["tolerance"]
    assert np.isfinite(run.tensors.O).all()


def test_the_oracle_check_fails_a_wrong_schedule():
    problem, (br, bc) = make("gqa_113x203_d59")

    def wrong_scale(mem, head, x):  # FA2 on keys scaled by 1.5: a plausible slip
        rows = Range(0, head.seqlen_q)
        q = mem.load(x.Q, rows)
        state = schedules.start_softmax_state(mem, rows, head.head_dim_v)
        k, v = mem.load(x.K, Range(0, head.seqlen_k)), mem.load(x.V, Range(0, head.seqlen_k))
        s = mem.matmul_nt(TensorId.S, q, k, 1.5 * head.scale)
        schedules.online_softmax_update(mem, state, s, v, head)
        lse = schedules.finish_softmax_state(mem, state)
        mem.store(x.O, rows, state.o)
        mem.store(x.LSE, rows, lse)

    result = schedules.run(wrong_scale, problem).check()
    assert not result.passed
    assert result.errors["O"] > 100 * result.tolerance


def test_an_output_left_unwritten_fails_the_check():
    problem, _ = make("one_key_239x1")
    result = schedules.run(lambda mem, head, x: None, problem).check()
    assert math.isinf(result.errors["O"]) and not result.passed


def test_the_update_written_in_python_computes_what_the_cpp_helper_computes():
    # The same ops in the same order on the same inputs give the same floats: the Python
    # update's calls reach the memory model's ops exactly as the C++ helper's do.
    problem, (br, bc) = make("causal_window_mqa")
    helper = schedules.run(fa2_forward, problem, block_rows=br, block_cols=bc, seed=3)
    by_hand = schedules.run(fa2_forward, problem, block_rows=br, block_cols=bc, seed=3,
                            update=online_softmax_update_in_python)
    assert np.array_equal(helper.tensors.O, by_hand.tensors.O)
    assert np.array_equal(helper.tensors.LSE, by_hand.tensors.LSE)


@pytest.mark.parametrize("name", ["gqa_113x203_d59", "causal_128x217_d40", "varlen_causal", "softcap_alibi",
                                  "dropout", "bf16_head_dim_v", "one_key_239x1"])
def test_python_standard_attention_counts_and_computes_what_the_cpp_one_does(name):
    # S and P through HBM tensors the schedule makes itself (HbmScratch).
    problem, blocks = make(name)
    cpp = sim.run("standard", problem, blocks=blocks, memory="shape", every_head=True)
    for memory in ("data", "shape"):
        run = schedules.run(standard_attention, problem, *blocks, memory=memory)
        assert run.counters == cpp.counters, memory
    assert run.counters["tensors"]["S"]["write_elements"] == sum(
        problem.heads_q * q * k for q, k in zip(*_sequence_lengths(problem)))
    assert schedules.run(standard_attention, problem, *blocks).check().passed


def _sequence_lengths(problem):
    if problem.varlen():
        cu_q, cu_k = problem.cu_seqlens_q, problem.cu_seqlens_k
        return ([b - a for a, b in zip(cu_q, cu_q[1:])], [b - a for a, b in zip(cu_k, cu_k[1:])])
    return [problem.seqlen_q] * problem.batch, [problem.seqlen_k] * problem.batch


def test_python_standard_attention_trace_is_the_cpp_trace():
    problem = sim.problem(seqlen_q=100, seqlen_k=70, head_dim=16, causal=True)
    cpp = sim.trace("standard", problem, blocks=(32, 32))
    python = schedules.trace(standard_attention, problem, 32, 32, blocks=(32, 32), name="standard")
    assert python.events == cpp.events and python.info == cpp.info
    schedules.check_replayable(python)


def test_hbm_scratch():
    scratch = schedules.HbmScratch(True)
    S = scratch.matrix(TensorId.S, "bf16", 4, 6)
    assert (S.id, S.rows, S.cols, S.dtype, S.has_data) == (TensorId.S, 4, 6, "bf16", True)
    assert np.all(S.values == 0)
    assert not schedules.HbmScratch(False).matrix(TensorId.P, "fp32", 2**20, 2**20).has_data  # shapes only
    with pytest.raises(ValueError, match="allowed: sizes >= 1"):
        scratch.matrix(TensorId.S, "fp32", 0, 4)
    with pytest.raises(ValueError, match="count it with a shape-only scratch"):
        scratch.matrix(TensorId.S, "fp32", 2**20, 2**20)
    with pytest.raises(ValueError, match="fp8"):
        scratch.matrix(TensorId.S, "fp8", 4, 4)


# ---------------------------------------------------------------------------------------------
# SRAM capacity


def test_sram_peak_and_a_bounded_arena_agree_with_the_cpp_schedule():
    problem, (br, bc) = make("causal_128x217_d40")
    peak = cpp_fa2(problem, (br, bc)).counters["sram_peak_bytes"]
    run = schedules.run(fa2_forward, problem, block_rows=br, block_cols=bc, sram=peak)  # exactly fits
    assert run.counters["sram_peak_bytes"] == peak
    assert run.counters == cpp_fa2(problem, (br, bc), sram=peak).counters


def test_an_over_budget_schedule_fails_with_the_arenas_message():
    problem, (br, bc) = make("gqa_113x203_d59")
    peak = cpp_fa2(problem, (br, bc)).counters["sram_peak_bytes"]
    with pytest.raises(sim.SramOverflow) as cpp_error:
        cpp_fa2(problem, (br, bc), memory="data", sram=peak - 1)
    for memory in ("data", "shape"):
        with pytest.raises(schedules.SramOverflow) as python_error:
            schedules.run(fa2_forward, problem, block_rows=br, block_cols=bc, memory=memory, sram=peak - 1)
        assert str(python_error.value) == str(cpp_error.value)
        assert "does not fit" in str(python_error.value) and f"M = {peak - 1} B" in str(python_error.value)


def test_tiles_held_too_long_count_against_sram():
    # A tile a Python name still holds keeps its SRAM: without the del, the previous key block
    # is live when the next one loads.
    problem, (br, bc) = make("window_200_d32")

    def keeping_tiles(mem, head, x):
        rows = Range(0, br)
        q = mem.load(x.Q, rows)
        kept = []
        for col_begin in range(0, 2 * bc, bc):
            kept.append(mem.load(x.K, Range(col_begin, bc)))
        return q, kept

    def freeing_tiles(mem, head, x):
        rows = Range(0, br)
        q = mem.load(x.Q, rows)
        for col_begin in range(0, 2 * bc, bc):
            k = mem.load(x.K, Range(col_begin, bc))
            del k
        return q

    kept = schedules.run(keeping_tiles, problem, memory="shape").counters["sram_peak_bytes"]
    freed = schedules.run(freeing_tiles, problem, memory="shape").counters["sram_peak_bytes"]
    tile = bc * problem.head_dim * 4
    assert (kept, freed) == (br * problem.head_dim * 4 + 2 * tile, br * problem.head_dim * 4 + tile)


# ---------------------------------------------------------------------------------------------
# Traces


@pytest.mark.parametrize("name", ["causal_128x217_d40", "window_200_d32", "one_key_239x1", "softcap_alibi"])
def test_python_fa2_trace_is_the_cpp_fa2_trace(name, tmp_path):
    fields, (br, bc) = PROBLEMS[name]
    problem = sim.problem(**{**fields, "heads_q": 1, "heads_kv": 1, "alibi_slopes": fields.get("alibi_slopes", [])[:1]
                             or None})
    cpp = sim.trace("fa2", problem, blocks=(br, bc), sram="64K", value_elements=4096)
    python = schedules.trace(fa2_forward, problem, block_rows=br, block_cols=bc, sram="64K", name="fa2",
                             path=tmp_path / "fa2_python.json")
    assert len(python) == len(cpp) > 0
    assert python.info == cpp.info
    assert python.events == cpp.events
    assert python.to_json() == cpp.to_json()
    # The file is the visualizer's: it loads through the trace loader's checks and replays.
    loaded = schedules.load_trace(tmp_path / "fa2_python.json")
    assert loaded.events == cpp.events
    schedules.check_replayable(loaded)


def test_a_trace_of_a_student_schedule_replays():
    problem = sim.problem(seqlen_q=64, seqlen_k=64, head_dim=16, causal=True)
    recorded = schedules.trace(fa2_forward, problem, block_rows=16, block_cols=32, name="my_fa2")
    assert recorded.info["schedule"] == "my_fa2"
    assert (recorded.info["block_rows"], recorded.info["block_cols"]) == (16, 32)
    kinds = {event["kind"] for event in recorded.events}
    assert kinds == {"load", "store", "compute", "free", "softmax_update", "line"}
    assert [e["line"] for e in recorded.events if e["kind"] == "line"][:4] == [4, 5, 7, 8]
    schedules.check_replayable(recorded)


def test_a_trace_past_its_bound_raises():
    problem = sim.problem(seqlen_q=64, head_dim=16)
    with pytest.raises(schedules.TraceOverflow, match="over the recorder's bound of 10 events"):
        schedules.trace(fa2_forward, problem, block_rows=16, block_cols=16, max_events=10)


# ---------------------------------------------------------------------------------------------
# The interface from Python


def one_head(**fields):
    problem = sim.problem(**{"seqlen_q": 40, "seqlen_k": 50, "head_dim": 8, **fields})
    tensors = schedules.random_tensors(problem, seed=5)
    return problem, problem.head(0, 0), schedules.head_tensors(tensors, problem, 0, 0)


def test_both_memory_models_offer_one_interface():
    public = lambda model: {name for name in dir(model) if not name.startswith("_")}
    assert public(DataMemory) == public(ShapeMemory)
    assert {"load", "store", "matmul_nt", "multiply_add", "row_max", "exp_minus_row", "apply_score_mods",
            "mark_line", "note_softmax_state", "counters"} <= public(DataMemory)
    assert (DataMemory.with_data, ShapeMemory.with_data) == (True, False)


def test_tile_values_and_hbm_views():
    problem, head, x = one_head()
    mem = DataMemory(problem.dtype)
    q = mem.load(x.Q, Range(8, 16), Range(2, 4))
    assert (q.id, q.rows, q.cols, q.bytes, q.dtype) == (TensorId.Q, Range(8, 16), Range(2, 4), 16 * 4 * 4, "fp32")
    assert np.array_equal(q.values, x.Q.values[8:24, 2:6])
    k = mem.load(x.K, Range(0, 50))
    s = mem.matmul_nt(TensorId.S, mem.load(x.Q, Range(0, 40)), k, head.scale)
    assert np.allclose(s.values, head.scale * x.Q.values @ x.K.values.T, rtol=1e-5, atol=1e-6)
    copy = s.values
    copy[:] = 0  # a copy: the tile is untouched
    assert not np.array_equal(s.values, copy)
    o = mem.filled(TensorId.O, Range(0, 40), Range(0, 8), 0.5)
    mem.store(x.O, Range(0, 40), o)
    assert np.all(x.O.values == 0.5)
    assert ShapeMemory().load(schedules.shape_head_tensors(problem, 0).Q, Range(0, 4)).values is None


def test_counters_and_sram_in_use():
    problem, head, x = one_head()
    mem = ShapeMemory(sram_bytes=4096)
    with mem.load(x.Q, Range(0, 32)) as q:
        assert mem.sram_in_use_bytes == 32 * 8 * 4 and q.live
    assert mem.sram_in_use_bytes == 0 and not q.live
    counters = mem.counters().to_dict()
    assert counters["tensors"]["Q"] == {"read_elements": 256, "write_elements": 0, "read_bytes": 1024, "write_bytes": 0}
    assert counters["loads"] == 1 and counters["sram_peak_bytes"] == 1024


def test_masks_from_the_head():
    problem, head, x = one_head(causal=True)
    assert head.coverage(0, 8, 40, 50) == BlockCoverage.empty  # bottom-right: row 7 sees keys <= 17
    assert head.visible_key_range(0, 8) == (0, 18)
    assert head.modifies_scores() is False
    _, softcapped, _ = one_head(softcap=2.0)
    assert softcapped.modifies_scores() is True


def test_a_tile_outlives_its_memory_model_name():
    problem, head, x = one_head()
    tile = DataMemory().load(x.V, Range(0, 10))  # the model is kept alive by its tile
    assert tile.live and tile.values.shape == (10, 8)
    tile.free()
    assert not tile.live


BAD_CALLS = {
    "window outside the tensor": (lambda mem, x, t, head: mem.load(x.Q, Range(30, 16)), "outside its 40 x 8"),
    "tile of another model": (lambda mem, x, t, head: mem.row_max(TensorId.m, DataMemory().load(x.Q, Range(0, 4))),
                              "belongs to another memory model"),
    "freed tile": (lambda mem, x, t, head: (t.free(), mem.row_sum(TensorId.l, t)), "was freed"),
    "matmul shapes": (lambda mem, x, t, head: mem.matmul_nn(TensorId.S, t, mem.load(x.K, Range(0, 4))),
                       "matmul shapes differ"),
    "store shape": (lambda mem, x, t, head: mem.store(x.O, Range(0, 5), t), "is not 5 x 8"),
    "empty tile": (lambda mem, x, t, head: mem.zeros(TensorId.O, Range(0, 0), Range(0, 8)), "allowed: sizes >= 1"),
    "aliased multiply_add": (lambda mem, x, t, head: mem.multiply_add(t, t, Transpose.no, t, Transpose.yes),
                             "also an operand"),
    "negative line": (lambda mem, x, t, head: mem.mark_line(-1), "line = -1; allowed: >= 0"),
    "score tile past the keys": (
        lambda mem, x, t, head: mem.apply_score_mods(mem.zeros(TensorId.S, Range(0, 4), Range(45, 10)), head),
        "cols of the tile [45, 55); allowed: 0 <= begin < end <= seqlen_k = 50"),
    "mismatched softmax update": (
        lambda mem, x, t, head: schedules.online_softmax_update(
            mem, schedules.start_softmax_state(mem, Range(0, 8), 8), mem.zeros(TensorId.S, Range(0, 8), Range(0, 10)),
            mem.load(x.V, Range(0, 12)), head),
        "do not fit the state's O"),
    "coverage past the rows": (lambda mem, x, t, head: head.coverage(0, 41, 0, 8), "out of range"),
}


@pytest.mark.parametrize("model", [DataMemory, ShapeMemory])
@pytest.mark.parametrize("case", BAD_CALLS)
def test_bad_calls_raise_value_error_naming_the_problem(model, case):
    problem, head, x = one_head()
    mem = model(problem.dtype)
    tile = mem.load(x.Q, Range(0, 8))
    call, message = BAD_CALLS[case]
    with pytest.raises(ValueError, match=re.escape(message)):
        call(mem, x, tile, head)


def test_a_data_model_refuses_views_without_values():
    problem, _, x = one_head()
    with pytest.raises(ValueError, match="a shape-only view holds no values"):
        DataMemory().load(schedules.shape_head_tensors(problem, 0).K, Range(0, 4))
    with pytest.raises(ValueError, match="dQ: this run has no such tensor"):
        DataMemory().load(x.dQ, Range(0, 4))


def test_ranges_and_tiles_beyond_int_or_host_memory_are_refused():
    for begin, size in ((-1, 4), (0, -1), (2**31 - 8, 16)):
        with pytest.raises(ValueError, match=re.escape(f"Range({begin}, {size}); allowed: begin >= 0")):
            Range(begin, size)
    rows = Range(0, 8)
    with pytest.raises(ValueError, match="begin >= 0"):
        rows.begin = -3
    assert rows == Range(0, 8)
    with pytest.raises(ValueError, match="the host memory of a data run"):
        DataMemory().zeros(TensorId.S, Range(0, 2**20), Range(0, 2**20))
    assert ShapeMemory().zeros(TensorId.S, Range(0, 2**20), Range(0, 2**20)).bytes == 4 * 2**40  # shapes only


def test_bad_runs_raise_with_clear_messages():
    problem, _ = make("gqa_113x203_d59")
    with pytest.raises(ValueError, match="memory model 'gpu' is unknown; allowed: data, shape"):
        schedules.run(fa2_forward, problem, memory="gpu")
    with pytest.raises(TypeError, match="is not callable"):
        schedules.run("fa2", problem)
    with pytest.raises(TypeError, match=re.escape("allowed: a Problem (flashlab.sim.problem(...))")):
        schedules.run(fa2_forward, {"seqlen_q": 4})
    with pytest.raises(ValueError, match="block_rows = 0; allowed: >= 1"):
        schedules.run(fa2_forward, problem, block_rows=0)
    with pytest.raises(ValueError, match="a shape run has no outputs"):
        schedules.run(fa2_forward, problem, memory="shape").check()
    with pytest.raises(ValueError, match="one head only"):
        schedules.trace(fa2_forward, problem, blocks=(32, 32))
    with pytest.raises(ValueError, match="blocks not given"):
        schedules.trace(fa2_forward, sim.problem(seqlen_q=8, head_dim=8))
    with pytest.raises(ValueError, match="seed = -1"):
        schedules.run(fa2_forward, problem, seed=-1)
    with pytest.raises(ValueError, match="sram_bytes = -1"):
        DataMemory(sram_bytes=-1)
    with pytest.raises(ValueError, match="fp8"):
        ShapeMemory(dtype="fp8")


def test_tensors_from_arrays_and_of_the_problem():
    problem, _ = make("gqa_113x203_d59")
    tensors = schedules.random_tensors(problem)
    q = np.full(tensors.Q.shape, 1 / 3, dtype=np.float32)
    tensors.assign(TensorId.Q, q)
    assert np.array_equal(tensors.Q, q)
    with pytest.raises(ValueError, match="allowed: 406 x 2 x 59"):
        tensors.assign(TensorId.K, np.zeros((5, 2, 59), dtype=np.float32))
    tensors.assign(TensorId.O, np.zeros(tensors.O.shape, dtype=np.float32))  # a backward's input
    assert np.array_equal(tensors.O, np.zeros(tensors.O.shape))
    with pytest.raises(ValueError, match="allowed: Q, K, V, O, LSE, and dO in tensors made with backward=True"):
        tensors.assign(TensorId.dO, np.zeros(tensors.O.shape, dtype=np.float32))  # forward tensors have no dO
    with pytest.raises(ValueError, match="allowed: Q, K, V, O, LSE"):
        tensors.assign(TensorId.dQ, np.zeros(tensors.Q.shape, dtype=np.float32))
    backward = schedules.random_tensors(problem, backward=True)
    assert np.isnan(backward.dQ).all() and np.isfinite(backward.dO).all() and backward.dK.shape == backward.K.shape
    backward.assign(TensorId.dO, np.ones(backward.dO.shape, dtype=np.float32))
    assert np.array_equal(backward.dO, np.ones(backward.dO.shape))
    with pytest.raises(ValueError, match="rows x heads x dim of the problem"):
        schedules.head_tensors(tensors, sim.problem(seqlen_q=300, head_dim=59), 0, 0)
    with pytest.raises(ValueError, match="head_index = 4; allowed: 0..3"):
        schedules.head_tensors(tensors, problem, 0, 4)
    # bf16 inputs are rounded on the way in, as the simulator's data runs hold them.
    bf16 = sim.problem(seqlen_q=4, head_dim=8, dtype="bf16")
    rounded = schedules.random_tensors(bf16)
    rounded.assign(TensorId.V, np.full(rounded.V.shape, 1 + 2**-10, dtype=np.float32))
    assert np.all(rounded.V == 1.0)
