"""flashlab.sim.search: the best tiling derived by hand, the rules' place, the verification run, refusals."""
import pathlib
import sys

import pytest

from flashlab import sim


def fa2_hbm(query_blocks, heads=1):
    # N = 1024, d = 64, fp16: Q, O once and K, V once per query block (131072 B each), LSE 4096 B.
    return heads * ((2 + 2 * query_blocks) * 131072 + 4096)


def test_fa2_best_tiling_by_hand():
    # Working set 276 Br + 256 Bc + 4 Br Bc <= 65536 with Bc = 16: Br <= 180, so 176 (6 query blocks).
    p = sim.problem(seqlen_q=1024, head_dim=64, dtype="fp16", heads_q=2)
    result = sim.search("fa2", p, sram="64K", multiple_of=16)
    assert result["format"] == "flashlab-search"
    assert result["best"]["blocks"] == {"block_rows": 176, "block_cols": 16}
    assert result["best"]["hbm_bytes"] == fa2_hbm(6, heads=2)
    assert result["verification"]["closed_form_equal"] and result["verification"]["hbm_bytes"] == fa2_hbm(6, heads=2)
    fitting, paper = result["rules"]
    assert (fitting["rule"], fitting["tiling"]["blocks"]["block_rows"]) == ("fitting", 92)  # 12 query blocks
    assert fitting["ratio_to_best"] == pytest.approx(fa2_hbm(12) / fa2_hbm(6))
    assert not fitting["on_front"] and not paper["within_constraints"]
    assert result["front"][-1]["blocks"] == result["best"]["blocks"]
    assert result["search_seconds"] >= 0


def test_loop_orders_and_time_objective():
    p = sim.problem(seqlen_q=512, head_dim=64, dtype="bf16", causal=True)
    result = sim.search(["fa1", "fa2"], p, machine="h100", sram="64K", multiple_of=16, objective="time")
    assert result["best"]["schedule"] == "fa2" and result["machine"] == "h100"
    assert len(result["rules"]) == 4 and result["best"]["seconds"] > 0
    assert all(point["seconds"] >= result["best"]["seconds"] for point in result["front"])


def test_bad_input():
    p = sim.problem(seqlen_q=1024, head_dim=64, dtype="fp16")
    with pytest.raises(ValueError, match="no tiling of fa2"):
        sim.search("fa2", p, sram=4096, multiple_of=16)
    with pytest.raises(ValueError, match="different passes"):
        sim.search("fa2,fa2_backward", p, sram="64K")
    with pytest.raises(ValueError, match="needs a machine"):
        sim.search("fa2", p, sram="64K", objective="time")
    with pytest.raises(ValueError, match="multiple_of"):
        sim.search("fa2", p, sram="64K", multiple_of=0)


def test_work_budget():
    # Past a small budget, the search prunes by its bound and still proves the same best.
    p = sim.problem(seqlen_q=1024, head_dim=64, dtype="fp16")
    full = sim.search("fa2", p, sram="64K", multiple_of=16)
    tight = sim.search("fa2", p, sram="64K", multiple_of=16, max_tile_steps=20000)
    assert full["candidates_costed"] == full["candidates_total"] and full["best_exact"]
    assert tight["candidates_pruned"] + tight["candidates_skipped"] > 0
    assert tight["best_exact"] and tight["best"]["hbm_bytes"] == full["best"]["hbm_bytes"]


def test_record_is_valid_against_the_cli_schema():
    root = pathlib.Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tests" / "sim"))
    from json_schema import validate  # the repository's validator (tests/sim/json_schema.py)

    p = sim.problem(seqlen_q=512, head_dim=64, dtype="bf16")
    for record in (sim.search("fa2", p, sram="64K", multiple_of=16),
                   sim.search("fa1,fa2", p, machine="h100", objective="time", max_tile_steps=5000)):
        assert validate(str(root / "docs" / "schemas" / "search.schema.json"), record) == []
