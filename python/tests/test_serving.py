"""flashlab.sim.run for decoding as serving engines see it (a paged KV cache, serving metrics) and
the backward's dK/dV group reduction, against counts derived by hand."""
import pytest

from flashlab import sim


def _decode(**kwargs):
    # One token for 8 query heads on 2 KV heads, 1000 cached tokens, d = 64, fp16.
    return sim.problem(seqlen_q=1, seqlen_k=1000, head_dim=64, heads_q=8, heads_kv=2, dtype="fp16", **kwargs)


def test_paged_cache_reads_the_block_table_and_whole_pages():
    # 3 chunks of 334 keys, key blocks of 48, pages of 100: 30 block-table entries per KV head
    # (tests/sim/test_serving.cpp lists them); whole pages read 30 x 100 rows per KV head.
    valid = sim.run("split_kv", _decode(), blocks=(16, 48, 3), page_size=100)
    whole = sim.run("split_kv", _decode(), blocks=(16, 48, 3), page_size=100, page_reads="whole_pages")
    assert valid.counters["tensors"]["page_table"]["read_bytes"] == 2 * 30 * 4
    assert valid.counters["tensors"]["K"]["read_bytes"] == 2 * 1000 * 64 * 2
    assert whole.counters["tensors"]["K"]["read_bytes"] == 2 * 3000 * 64 * 2
    assert valid.closed_form_equal and whole.closed_form_equal
    assert valid.serving["kv_cache_bytes"] == 2 * 1000 * 128 * 2
    assert valid.serving["kv_bytes_per_token"] == 2 * 1000 * 128 * 2
    assert valid.serving["page_table_bytes"] == 240 and valid.serving["page_reads"] == "valid_rows"
    assert whole.serving["kv_reads_per_cached_byte"] == 3.0
    assert whole.record()["serving_kv_read_bytes"] == 2 * 3000 * 128 * 2
    contiguous = sim.run("split_kv", _decode(), blocks=(16, 48, 3))
    assert contiguous.serving["page_size"] == 0 and "page_table" not in contiguous.counters["tensors"]
    assert sim.run("fa2", _decode(), blocks=(16, 48)).serving is None


def test_in_place_group_reduction_by_hand():
    # 8 heads on 2 KV heads, 100 keys, d = 16, bf16: dK read 51200 B with fp32 parts, 12800 B in place.
    p = sim.problem(seqlen_q=100, head_dim=16, heads_q=8, heads_kv=2, dtype="bf16")
    parts = sim.run("fa2_backward", p, blocks=(32, 48))
    in_place = sim.run("fa2_backward", p, blocks=(32, 48), dkv_reduction="in_place")
    assert parts.counters["tensors"]["dK"]["read_bytes"] == 51200
    assert in_place.counters["tensors"]["dK"]["read_bytes"] == 12800
    assert in_place.counters["tensors"]["dK"]["write_bytes"] == 70400
    assert parts.closed_form_equal and in_place.closed_form_equal


@pytest.mark.parametrize("kwargs, message", [
    ({"page_size": -1}, "page_size = -1; allowed: 1..65536"),
    ({"page_size": 16, "page_reads": "some_rows"}, "allowed: 'valid_rows', 'whole_pages'"),
    ({"dkv_reduction": "atomics"}, "allowed: fp32_partials, in_place"),
])
def test_serving_option_refusals(kwargs, message):
    with pytest.raises(ValueError) as raised:
        sim.run("split_kv", _decode(), blocks=(16, 48, 3), **kwargs)
    assert message in str(raised.value)


def test_page_size_outside_decoding_is_refused():
    with pytest.raises(ValueError) as raised:
        sim.run("fa2", _decode(), blocks=(16, 48), page_size=16)
    assert "split_kv" in str(raised.value)
