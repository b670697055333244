"""flashlab.sim.hardware: the three-level model and the time model from Python, the same records as
`flashlab hardware --json`, the time model asked again with other constants, and bad input refused."""
import pytest

from flashlab import sim


def problem(**kw):
    args = dict(seqlen_q=1024, head_dim=128, batch=16, heads_q=16, dtype="bf16")
    args.update(kw)
    return sim.problem(**args)


def test_fa2_forward_on_the_h200_preset():
    record = sim.hardware("fa2", problem())
    assert record["schedule"] == "fa2" and record["tiling"]["block_rows"] == 128 and record["tiling"]["block_cols"] == 64
    assert record["blocks_per_sm"] == 2 and record["resident_blocks"] == 264 and record["thread_blocks"] == 2048
    # Q, K and V from DRAM once (the L2 catches K and V's re-reads), as Nsight Compute measured (201 MB).
    assert record["l2"]["dram_read_bytes"] == 3 * 16 * 1024 * 16 * 128 * 2
    # cp.async into padded shared rows: every odd row of a tile fetches its 8 sectors twice (1.5x,
    # Nsight Compute's 1.71 GB against 1.14 GB of tiles); O and LSE stored once, no reductions.
    assert 2 * record["l2"]["l2_to_sm_bytes"] == 3 * record["two_level"]["hbm_read_bytes"]
    assert record["tiling"]["async_copy_row_bytes"] == (128 + 8) * 2
    assert record["l2"]["sm_to_l2_write_sectors"] == 2048 * 1152 and record["l2"]["sm_to_l2_reduction_sectors"] == 0
    assert record["time"]["bound"] == "tensor" and record["time"]["constants"] == "fa2_forward"


def test_the_time_model_with_other_constants():
    run = sim.hardware_run("fa2", problem(batch=2, heads_q=4))
    base = {"tensor_efficiency": 0.5, "softmax_cycles_per_score": 0.1, "block_seconds": 1e-6}
    slower = dict(base, tensor_efficiency=0.25)
    a, b = run.time(base), run.time(slower)
    assert b["step_tensor_seconds"] == pytest.approx(2 * a["step_tensor_seconds"])
    assert b["seconds"] > a["seconds"]
    by_dim = run.time(dict(base, tensor_efficiency_by_head_dim={"128": 0.25}))
    assert by_dim["step_tensor_seconds"] == pytest.approx(b["step_tensor_seconds"])
    assert len(run.block_steps) == run.record()["thread_blocks"]
    with pytest.raises(ValueError, match="time constant 'speed' is unknown"):
        run.time(dict(base, speed=1.0))


def test_equal_inputs_equal_records():
    a = sim.hardware("fa3", problem(batch=1, seqlen_q=700, causal=True), direction="backward", l2="1M")
    b = sim.hardware("fa3", problem(batch=1, seqlen_q=700, causal=True), direction="backward", l2="1M")
    a.pop("model_seconds"), b.pop("model_seconds")
    assert a == b and a["l2_bytes"] == 1 << 20


@pytest.mark.parametrize("call, words", [
    (lambda: sim.hardware("fa9", problem()), "kernel 'fa9' is unknown"),
    (lambda: sim.hardware("fa1", problem()), "dtype bf16 with the fa1 kernel; allowed: fp16"),
    (lambda: sim.hardware("fa2", problem(), machine="h100"), "has no \"gpu\""),
    (lambda: sim.hardware("fa2", problem(), layout="bshd"), "layout 'bshd' is unknown"),
    (lambda: sim.hardware("fa2", problem(heads_kv=4), direction="backward"), "heads_kv = heads_q"),
    (lambda: sim.hardware("fa2", problem(), blocks_per_sm=-1), "blocks_per_sm = -1 is out of range"),
    (lambda: sim.hardware("fa2", problem(), l2="12Q"), "size '12Q' is not understood"),
    (lambda: sim.hardware(2, problem()), "kernel = 2; allowed: a string"),
])
def test_bad_input_is_refused(call, words):
    with pytest.raises(ValueError, match=words):
        call()
