"""flashlab.sim's Ring Attention model (sim/ring.hpp): the same numbers as `flashlab ring`, the
registry's ring schedules with their devices and ordering, and the refusals."""
import pytest

from flashlab import sim


def test_the_ring_model_counts_devices_and_steps():
    p = sim.problem(seqlen_q=8 * 2048, head_dim=128, heads_q=4, causal=True, dtype="bf16")
    model = sim.ring(p, devices=8, ordering="zigzag", machine="h200")
    assert len(model["devices"]) == 8 and len(model["steps"]) == 8
    assert model["blocks"]["devices"] == 8 and model["blocks"]["ordering"] == "zigzag"
    for step in model["steps"]:
        assert sorted(step["blocks"]) == list(range(8))
        assert step["hidden"] == (step["link_seconds"] <= step["compute_seconds"])
    # K and V of a 2048-token shard, 4 heads, d 128, bf16, sent at steps 0..6 only.
    assert [s["link_bytes"] for s in model["steps"]] == [2048 * 4 * 256 * 2] * 7 + [0]
    assert 0 <= model["hidden_link_share"] <= 1


def test_where_overlap_begins_follows_the_estimate():
    p = sim.problem(seqlen_q=1, head_dim=128, heads_q=8, dtype="bf16")
    points = sim.ring_overlap(p, [2, 8], machine="h200")
    assert [(q["devices"], q["backward"]) for q in points] == [(2, False), (2, True), (8, False), (8, True)]
    forward = points[2]
    assert forward["estimate"] == pytest.approx(989e12 * 2 / (2 * 450e9))
    assert 0.9 * forward["estimate"] <= forward["seqlen_per_device"] <= 1.3 * forward["estimate"]


def test_the_registry_runs_the_ring_with_its_devices_and_ordering():
    p = sim.problem(seqlen_q=300, head_dim=32, causal=True)
    blocks = sim.BlockSizes(32, 32)
    blocks.devices, blocks.ordering = 3, "striped"
    result = sim.run("ring_backward", p, blocks=blocks)
    assert result.closed_form_equal
    assert result.blocks["devices"] == 3 and result.blocks["ordering"] == "striped"
    with pytest.raises(ValueError, match="ring ordering 'spiral' is unknown"):
        blocks.ordering = "spiral"
    with pytest.raises(ValueError, match="ring attention: dropout given"):
        sim.run("ring", sim.problem(seqlen_q=64, head_dim=32, dropout_p=0.1), blocks=(16, 16))
    with pytest.raises(ValueError, match="ring devices = 0; allowed: 1..1024"):
        sim.ring(p, devices=0)
