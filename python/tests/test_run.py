"""flashlab.sim.run and check: counters against hand derivations, the C++ closed forms and the oracle."""
import math

import pytest

from flashlab import sim


def test_fa2_counts_by_hand():
    # FA2 Algorithm 1 without a mask: Q read once, K and V once per query block, O and LSE written
    # once; 2 flops per multiply-add of S = Q K^T and O = P V.
    n, d, block_rows, block_cols = 1000, 48, 64, 32
    result = sim.run("fa2", sim.problem(seqlen_q=n, head_dim=d), blocks=(block_rows, block_cols))
    query_blocks = math.ceil(n / block_rows)
    tensors = result.counters["tensors"]
    assert tensors["Q"]["read_elements"] == n * d
    assert tensors["K"]["read_elements"] == query_blocks * n * d
    assert tensors["V"]["read_elements"] == query_blocks * n * d
    assert tensors["O"]["write_elements"] == n * d
    assert tensors["LSE"]["write_elements"] == n
    assert set(tensors) == {"Q", "K", "V", "O", "LSE"}
    assert result.counters["hbm_bytes"] == 4 * (n * d * (2 + 2 * query_blocks) + n)  # fp32
    assert result.counters["matmul_flops"] == 2 * 2 * n * n * d
    assert result.blocks == {"block_rows": block_rows, "block_cols": block_cols}


def test_heads_multiply_the_traffic():
    one = sim.run("fa1", sim.problem(seqlen_q=200, head_dim=32), sram="16K")
    many = sim.run("fa1", sim.problem(seqlen_q=200, head_dim=32, batch=2, heads_q=3), sram="16K")
    assert many.heads_total == 6 and many.heads_run == 1  # identical heads: run once, multiplied
    assert many.counters["hbm_bytes"] == 6 * one.counters["hbm_bytes"]
    assert many.counters["sram_peak_bytes"] == one.counters["sram_peak_bytes"]


@pytest.mark.parametrize("schedule", sim.schedule_names())
def test_every_schedule_counts_its_closed_form(schedule):
    # GQA, unequal lengths, a causal mask, sizes that divide nothing.
    p = sim.problem(seqlen_q=113, seqlen_k=203, head_dim=59, heads_q=4, heads_kv=2, causal=True, dtype="bf16")
    result = sim.run(schedule, p, sram="32K")
    expected = sim.closed_form(schedule, p, (result.blocks["block_rows"], result.blocks["block_cols"],
                                             result.blocks.get("num_splits", 0)), sram="32K")
    assert result.counters["tensors"] == expected["tensors"]
    assert result.counters["matmul_flops"] == expected["matmul_flops"]
    assert result.closed_form_equal


def test_data_and_shape_runs_count_the_same():
    p = sim.problem(seqlen_q=70, head_dim=24, causal=True)
    shape = sim.run("fa2", p, sram="8K")
    data = sim.run("fa2", p, sram="8K", memory="data")
    assert data.counters == shape.counters


def test_roofline_is_the_slowest_resource():
    preset = sim.machine("h200")
    result = sim.run("fa2", sim.problem(seqlen_q=4096, head_dim=128, dtype="bf16"), machine="h200")
    assert result.sram_bytes == preset["sram_bytes"]  # M from the machine
    c = result.counters
    times = {"hbm": c["hbm_bytes"] / preset["hbm_bytes_per_second"],
             "matmul": c["matmul_flops"] / preset["matmul_flops_per_second"],
             "exp": c["exponentials"] / preset["exp_per_second"],
             "other": c["other_flops"] / preset["fp32_flops_per_second"]}
    assert result.roofline["seconds"] == pytest.approx(max(times.values()))
    assert result.roofline["bound_by"] == max(times, key=times.get)
    assert result.record()["roofline_seconds"] == result.roofline["seconds"]


def test_bound_of_a_run_covers_every_head():
    n, d, m_bytes = 2048, 64, 96 * 1024
    result = sim.run("fa2", sim.problem(seqlen_q=n, head_dim=d, heads_q=4, dtype="bf16"), sram=m_bytes)
    m = m_bytes / 2
    assert result.bound["formula"] == "N^2 d^2 / M"
    assert result.bound["elements"] == pytest.approx(4 * n * n * d * d / m)


def test_check_against_the_oracle():
    row = sim.check("fa2")
    assert row["passed"] and set(row["errors"]) == {"O", "LSE"}
    assert all(error <= row["tolerance"] for error in row["errors"].values())
    backward = sim.check("fa2_backward", sim.problem(seqlen_q=50, seqlen_k=77, head_dim=20, causal=True))
    assert backward["passed"] and set(backward["errors"]) == {"dQ", "dK", "dV"}


@pytest.mark.parametrize("call, error, message", [
    (lambda p: sim.run("fa9", p, sram="96K"), ValueError, "schedule 'fa9' is unknown; allowed: standard, fa1, fa1_skip, fa2"),
    (lambda p: sim.run("fa2", p), ValueError, "sram: give the SRAM size"),
    (lambda p: sim.run("fa2", p, sram=-1), ValueError, "sram = -1 is out of range; allowed: [0, 1099511627776]"),
    (lambda p: sim.run("fa2", p, sram="12Q"), ValueError, "sram: size '12Q' is not understood"),
    (lambda p: sim.run("fa2", p, sram=16), ValueError, "SRAM size M = 16 B is below the smallest working set of 'fa2'"),
    (lambda p: sim.run("fa2", p, sram=1024, blocks=(64, 64)), sim.SramOverflow, "does not fit"),
    (lambda p: sim.run("fa2", p, blocks=(64,)), ValueError, "blocks = (64,); allowed: (block_rows, block_cols)"),
    (lambda p: sim.run("fa2", p, sram="96K", memory="gpu"), ValueError, "gpu"),
    (lambda p: sim.run("fa2", p, machine="z80"), ValueError, "machine 'z80' is unknown"),
])
def test_run_refusals(call, error, message):
    with pytest.raises(error) as raised:
        call(sim.problem(seqlen_q=256, head_dim=64))
    assert message in str(raised.value)


def test_runs_past_the_limits_are_refused_before_they_start():
    huge = sim.problem(seqlen_q=2**20, head_dim=64, batch=64, heads_q=64)
    with pytest.raises(ValueError, match=r"host memory in bytes = \d+; allowed: at most 4294967296"):
        sim.run("fa2", huge, sram="96K", memory="data")
