"""flashlab.ops.flash_attn_with_kvcache on a GPU (the decode rung): against attention in float64 on
the gathered cache, by the 2x rule (twice the error of the same attention computed by PyTorch in
the inputs' precision, plus a rounding slack); contiguous and paged caches (pages in a random
order), the append of new tokens, causal query tokens, and the refusals."""
import pytest

torch = pytest.importorskip("torch")
from flashlab import ops  # noqa: E402

pytestmark = pytest.mark.gpu


def reference(q, keys, values, lengths, causal, dtype):
    """Attention per sequence over its first lengths[b] keys: in float64, and in `dtype` the way a
    framework computes it (the naive error of the rule)."""
    outputs = {}
    for precision in (torch.float64, dtype):
        out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
        for b, length in enumerate(lengths):
            qb = q[b].transpose(0, 1).to(precision)  # [heads, tokens, d]
            kb = keys[b, :length].transpose(0, 1).to(precision)
            vb = values[b, :length].transpose(0, 1).to(precision)
            group = qb.shape[0] // kb.shape[0]
            kb, vb = kb.repeat_interleave(group, 0), vb.repeat_interleave(group, 0)
            scores = qb @ kb.transpose(1, 2)
            scores = (scores if precision == torch.float64 else scores.float()) * q.shape[-1] ** -0.5
            if causal:
                tokens = q.shape[1]
                hidden = torch.arange(length, device=q.device)[None, :] > \
                    torch.arange(tokens, device=q.device)[:, None] + length - tokens
                scores = scores.masked_fill(hidden, float("-inf"))
            p = torch.softmax(scores, -1)
            p = torch.nan_to_num(p, nan=0.0).to(precision)
            out[b] = (p @ vb).transpose(0, 1).double()
        outputs[precision] = out
    return outputs[torch.float64], outputs[dtype]


def check(out, exact, naive):
    error = (out.double() - exact).abs().max().item()
    naive_error = (naive - exact).abs().max().item()
    assert not torch.isnan(out).any()
    assert error <= 2 * naive_error + 1e-3, (error, naive_error)


@pytest.mark.parametrize("page_size", [0, 16, 64, 256])
@pytest.mark.parametrize("tokens,causal", [(1, False), (4, True), (4, False)])
def test_decode_matches_attention_on_the_cache(page_size, tokens, causal):
    torch.manual_seed(page_size * 10 + tokens)
    dtype, batch, heads_q, heads_kv, d = torch.bfloat16, 3, 8, 2, 128
    lengths, appended = [1000, 5, 3000], 2
    capacity = 3000 + 100
    q = torch.randn(batch, tokens, heads_q, d, device="cuda", dtype=dtype)
    keys = torch.randn(batch, capacity, heads_kv, d, device="cuda", dtype=dtype)
    values = torch.randn_like(keys)
    new_k = torch.randn(batch, appended, heads_kv, d, device="cuda", dtype=dtype)
    new_v = torch.randn_like(new_k)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    for b, length in enumerate(lengths):  # past each sequence: poison, in the cache too
        keys[b, length:], values[b, length:] = float("nan"), float("nan")
    if page_size:
        pages_per_sequence = (capacity + page_size - 1) // page_size
        order = torch.randperm(batch * pages_per_sequence + 5, device="cuda").to(torch.int32)
        block_table = order[:batch * pages_per_sequence].view(batch, pages_per_sequence).contiguous()
        k_cache = torch.full((order.numel(), page_size, heads_kv, d), float("nan"), device="cuda", dtype=dtype)
        v_cache = k_cache.clone()
        for b in range(batch):
            for page in range(pages_per_sequence):
                rows = slice(page * page_size, min((page + 1) * page_size, capacity))
                count = rows.stop - rows.start
                k_cache[block_table[b, page], :count] = keys[b, rows]
                v_cache[block_table[b, page], :count] = values[b, rows]
    else:
        block_table = None
        k_cache, v_cache = keys.clone(), values.clone()
    # The reference sees the new tokens where the append puts them.
    for b, length in enumerate(lengths):
        keys[b, length:length + appended], values[b, length:length + appended] = new_k[b], new_v[b]
    out, lse = ops.flash_attn_with_kvcache(q, k_cache, v_cache, k=new_k, v=new_v, cache_seqlens=cache_seqlens,
                                           block_table=block_table, causal=causal, return_softmax_lse=True)
    exact, naive = reference(q, keys, values, [n + appended for n in lengths], causal, dtype)
    check(out, exact, naive)
    assert lse.shape == (batch, heads_q, tokens) and lse.dtype == torch.float32
    # The new tokens are in the cache now.
    for b, length in enumerate(lengths):
        for j in range(appended):
            key = length + j
            where = (block_table[b, key // page_size], key % page_size) if page_size else (b, key)
            assert torch.equal(k_cache[where], new_k[b, j]) and torch.equal(v_cache[where], new_v[b, j])


def test_decode_long_cache_splits_across_the_gpu():
    torch.manual_seed(7)
    dtype, heads_q, heads_kv, d, length = torch.bfloat16, 32, 8, 128, 128 * 1024 + 3
    q = torch.randn(1, 1, heads_q, d, device="cuda", dtype=dtype)
    k_cache = torch.randn(1, length, heads_kv, d, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    out = ops.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=length)
    exact, naive = reference(q, k_cache, v_cache, [length], False, dtype)
    check(out, exact, naive)


def test_decode_refusals_name_the_input():
    q = torch.randn(1, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(4, 64, 2, 128, device="cuda", dtype=torch.bfloat16)
    table = torch.tensor([[0, 1, 7]], dtype=torch.int32, device="cuda")
    with pytest.raises(ops.KernelRefused, match=r"block_table\[0\]\[2\] = 7"):
        ops.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=150, block_table=table)
    with pytest.raises(ops.KernelRefused, match=r"cache_seqlens\[0\] = 200"):
        ops.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=200, block_table=table)
    with pytest.raises(ValueError, match="rotary_cos"):
        ops.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=1, block_table=table, rotary_cos=q)
