"""flashlab.distributed on the CPU: the orderings' layouts, the block pairs against the causal mask
score by score, the log-sum-exp merge, the ring with P logical ranks (forward and gradients against
attention on the gathered tensors, in fp64 through the PyTorch reference), the same ring over
torch.distributed with the gloo backend in P processes, and the refusals. Skipped without torch."""
import os
import socket

import pytest

torch = pytest.importorskip("torch")
from flashlab import distributed, ops  # noqa: E402

ORDERINGS = distributed.ORDERINGS


def reference_attention(q, k, v, causal):
    """Attention on whole sequences in q's dtype (fp64 here), GQA by repeating K, V's heads."""
    group = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    if causal:
        n = q.shape[1]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v)


def random_inputs(batch, length, heads, heads_kv, head_dim, seed):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, length, heads, head_dim, dtype=torch.float64, generator=generator)
    k = torch.randn(batch, length, heads_kv, head_dim, dtype=torch.float64, generator=generator)
    v = torch.randn(batch, length, heads_kv, head_dim, dtype=torch.float64, generator=generator)
    return q, k, v


@pytest.mark.parametrize("ordering", ORDERINGS)
def test_each_ordering_deals_every_position_once_and_gathers_back(ordering):
    for world_size in (1, 2, 3, 4, 8):
        n = 6
        positions = sorted(p for r in range(world_size) for p in distributed.shard_positions(r, world_size, n, ordering))
        assert positions == list(range(world_size * n))
        x = torch.arange(2 * world_size * n * 3, dtype=torch.float64).reshape(2, world_size * n, 3)
        shards = distributed.shard_sequence(x, world_size, ordering)
        assert all(s.shape == (2, n, 3) for s in shards)
        assert torch.equal(distributed.gather_sequence(shards, ordering), x)
    assert distributed.shard_positions(1, 4, 3, "striped") == [1, 5, 9]
    assert distributed.shard_positions(0, 2, 4, "zigzag") == [0, 1, 6, 7]


@pytest.mark.parametrize("ordering", ORDERINGS)
@pytest.mark.parametrize("causal", [False, True])
def test_block_pairs_cover_exactly_the_visible_scores(ordering, causal):
    for world_size in (1, 2, 3, 4):
        n = 4
        seen = {}
        for rank in range(world_size):
            queries = distributed.shard_positions(rank, world_size, n, ordering)
            for block in range(world_size):
                keys = distributed.shard_positions(block, world_size, n, ordering)
                for rows, cols, pair_causal in distributed.block_pairs(rank, block, world_size, n, ordering, causal):
                    q_rows, k_rows = range(n)[rows], range(n)[cols]
                    for a_index, a in enumerate(q_rows):
                        for b_index, b in enumerate(k_rows):
                            if pair_causal and b_index > a_index + (len(k_rows) - len(q_rows)):
                                continue  # hidden by the pair's (bottom-right) causal mask
                            pair = (queries[a], keys[b])
                            assert pair not in seen, f"score {pair} computed twice"
                            seen[pair] = True
        length = world_size * n
        expected = {(i, j) for i in range(length) for j in range(length) if not causal or j <= i}
        assert set(seen) == expected


def test_the_merge_is_attention_over_the_union_of_the_keys():
    q, k, v = random_inputs(2, 20, 3, 3, 8, seed=1)
    out, lse = ops.flash_attn_func(q, k[:, :7], v[:, :7], return_lse=True, generation="reference")
    block_out, block_lse = ops.flash_attn_func(q, k[:, 7:], v[:, 7:], return_lse=True, generation="reference")
    whole, whole_lse = ops.flash_attn_func(q, k, v, return_lse=True, generation="reference")
    out = out.clone()
    distributed.merge_by_lse(out, lse, block_out, block_lse)
    assert torch.allclose(out, whole, atol=1e-12) and torch.allclose(lse, whole_lse, atol=1e-12)
    # A row that has seen nothing yet (LSE = -inf, O = 0) takes the block whole.
    empty, none = torch.zeros_like(out), torch.full_like(lse, float("-inf"))
    distributed.merge_by_lse(empty, none, block_out, block_lse)
    assert torch.allclose(empty, block_out) and torch.equal(none, block_lse)


@pytest.mark.parametrize("ordering", ORDERINGS)
@pytest.mark.parametrize("causal", [False, True])
def test_the_local_ring_matches_attention_on_the_gathered_tensors(ordering, causal):
    for world_size, heads_kv in ((1, 2), (2, 2), (3, 1), (4, 2)):
        q, k, v = random_inputs(2, world_size * 6, 4, heads_kv, 8, seed=world_size)
        expected = reference_attention(q, k, v, causal)
        d_out = torch.randn_like(expected)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        reference_attention(*leaves, causal).backward(d_out)
        shards = [[s.clone().requires_grad_() for s in distributed.shard_sequence(t, world_size, ordering)] for t in (q, k, v)]
        outs = distributed.local_ring_attention(*shards, causal=causal, ordering=ordering)
        out = distributed.gather_sequence(outs, ordering)
        assert torch.allclose(out, expected, atol=1e-10), (world_size, (out - expected).abs().max())
        torch.autograd.backward(outs, distributed.shard_sequence(d_out, world_size, ordering))
        for name, leaf, parts in zip("qkv", leaves, shards):
            gradient = distributed.gather_sequence([p.grad for p in parts], ordering)
            assert torch.allclose(gradient, leaf.grad, atol=1e-10), (name, world_size, (gradient - leaf.grad).abs().max())


def test_the_local_ring_passes_gradcheck():
    q, k, v = random_inputs(1, 8, 2, 1, 4, seed=7)
    shards = [distributed.shard_sequence(t, 2, "zigzag") for t in (q, k, v)]
    inputs = [s.clone().requires_grad_() for parts in shards for s in parts]

    def ring(q0, q1, k0, k1, v0, v1):
        return tuple(distributed.local_ring_attention([q0, q1], [k0, k1], [v0, v1], causal=True))

    assert torch.autograd.gradcheck(ring, tuple(inputs))


def test_refusals_name_the_input():
    q, k, v = random_inputs(1, 8, 2, 2, 4, seed=3)
    parts = [distributed.shard_sequence(t, 2, "contiguous") for t in (q, k, v)]
    with pytest.raises(ValueError, match="ordering = 'spiral'; allowed: 'contiguous', 'striped', 'zigzag'"):
        distributed.local_ring_attention(*parts, ordering="spiral")
    odd = [[t[:, :3] for t in p] for p in parts]
    with pytest.raises(ValueError, match="seqlen_local = 3 with ordering 'zigzag'; allowed: even"):
        distributed.local_ring_attention(*odd)
    with pytest.raises(ValueError, match="a sequence of 10 tokens over 4 ranks"):
        distributed.shard_sequence(torch.zeros(1, 10, 1, 1), 4, "contiguous")
    with pytest.raises(ValueError, match="allowed: as many of each"):
        distributed.local_ring_attention(parts[0], parts[1][:1], parts[2])
    if not torch.distributed.is_initialized():
        with pytest.raises(ValueError, match="needs torch.distributed initialised"):
            distributed.ring_attention(q, k, v)


# ---------------------------------------------------------------------------------------------
# The same ring over torch.distributed: P processes with the gloo backend on the CPU.

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_rank(rank, world_size, port, ordering, causal, failures):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        q, k, v = random_inputs(2, world_size * 4, 2, 1, 8, seed=11)
        expected = reference_attention(q, k, v, causal)
        d_out = torch.randn(expected.shape, dtype=expected.dtype, generator=torch.Generator().manual_seed(5))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        reference_attention(*leaves, causal).backward(d_out)
        mine = [distributed.shard_sequence(t, world_size, ordering)[rank].clone().requires_grad_() for t in (q, k, v)]
        out = distributed.ring_attention(*mine, causal=causal, ordering=ordering)
        out.backward(distributed.shard_sequence(d_out, world_size, ordering)[rank])
        checks = [("out", out, expected)] + [(f"d{n}", t.grad, leaf.grad) for n, t, leaf in zip("qkv", mine, leaves)]
        for name, got, whole in checks:
            want = distributed.shard_sequence(whole, world_size, ordering)[rank]
            error = (got - want).abs().max().item()
            if not error < 1e-10:
                failures.put(f"rank {rank}: {name} off by {error}")
    except Exception as error:  # reported to the parent, which fails the test
        failures.put(f"rank {rank}: {type(error).__name__}: {error}")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("ordering,causal", [("zigzag", True)])
def test_the_ring_over_torch_distributed_gloo(ordering, causal):
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this torch")
    multiprocessing = torch.multiprocessing.get_context("spawn")
    failures = multiprocessing.Queue()
    world_size = 3
    port = _free_port()
    processes = [multiprocessing.Process(target=_gloo_rank, args=(r, world_size, port, ordering, causal, failures))
                 for r in range(world_size)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=120)
    alive = [p for p in processes if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "a rank hung"
    errors = []
    while not failures.empty():
        errors.append(failures.get())
    assert not errors, errors
    assert all(p.exitcode == 0 for p in processes)
