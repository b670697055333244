"""flashlab.sim.trace: one head's events, the visualizer's file, and the bounds on a trace."""
import json
import math

import pytest

from flashlab import sim


def fa2_trace(**extra):
    return sim.trace("fa2", sim.problem(seqlen_q=100, head_dim=16), blocks=(32, 16), **extra)


def test_events_follow_fa2_algorithm_1():
    trace = fa2_trace()
    query_blocks, key_blocks = math.ceil(100 / 32), math.ceil(100 / 16)
    loads = [e for e in trace.events if e["kind"] == "load"]
    assert sum(e["tensor"] == "Q" for e in loads) == query_blocks
    assert sum(e["tensor"] == "K" for e in loads) == query_blocks * key_blocks
    assert sum(e["tensor"] == "V" for e in loads) == query_blocks * key_blocks
    stores = [e for e in trace.events if e["kind"] == "store"]
    assert sorted({e["tensor"] for e in stores}) == ["LSE", "O"]
    assert sum(e["row_count"] * e["col_count"] for e in stores if e["tensor"] == "O") == 100 * 16
    # The bytes the events move are the run's HBM traffic.
    run = sim.run("fa2", sim.problem(seqlen_q=100, head_dim=16), blocks=(32, 16))
    assert sum(e["bytes"] for e in loads) == run.counters["hbm_read_bytes"]
    assert sum(e["bytes"] for e in stores) == run.counters["hbm_write_bytes"]


def test_softmax_state_and_tile_values():
    trace = fa2_trace()
    updates = [e for e in trace.events if e["kind"] == "softmax_update"]
    assert updates and all(len(e["row_max"]) == len(e["row_sum"]) == len(e["rescale"]) == e["row_count"] for e in updates)
    probabilities = [e for e in trace.events if e["kind"] == "compute" and e["tensor"] == "P" and "values" in e]
    assert probabilities and all(0.0 <= v <= 1.0 for e in probabilities for v in e["values"])


def test_header():
    trace = sim.trace("fa2", sim.problem(seqlen_q=64, seqlen_k=80, head_dim=16, causal=True), sram="8K")
    info = trace.info
    assert (info["schedule"], info["seqlen_q"], info["seqlen_k"], info["head_dim"]) == ("fa2", 64, 80, 16)
    assert info["causal"] and info["sram_capacity_bytes"] == 8192
    assert max(e["sram_bytes"] for e in trace.events) <= 8192


def test_file_round_trip(tmp_path):
    path = tmp_path / "fa2.json"
    trace = fa2_trace(path=str(path))
    text = json.loads(path.read_text())
    assert text["format"] == "flashlab-trace" and len(text["events"]) == len(trace)
    loaded = sim.load_trace(str(path))
    assert loaded.info == trace.info and loaded.events == trace.events


@pytest.mark.parametrize("call, error, message", [
    (lambda: sim.trace("fa2", sim.problem(seqlen_q=64, head_dim=16, batch=2), sram="8K"), ValueError,
     "trace: batch 2, heads_q 1; one head only"),
    (lambda: fa2_trace(max_events=10), sim.TraceOverflow, "over the recorder's bound of 10 events"),
    (lambda: fa2_trace(max_events=0), ValueError, "max_events = 0 is out of range; allowed: [1, 2000000]"),
    (lambda: fa2_trace(value_elements=-1), ValueError, "value_elements"),
    (lambda: sim.load_trace("/nonexistent/trace.json"), ValueError, "/nonexistent/trace.json"),
])
def test_trace_refusals(call, error, message):
    with pytest.raises(error) as raised:
        call()
    assert message in str(raised.value)


def test_a_malformed_trace_file_is_refused(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"format": "flashlab-trace", "version": 99}')
    with pytest.raises(ValueError, match="version"):
        sim.load_trace(str(path))
