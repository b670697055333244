"""flashlab.distributed on one GPU: the ring with P logical ranks (each on its own CUDA stream,
device-to-device copies in place of NCCL) against attention on the gathered tensors, forward by
the 2x rule and gradients by the 3x rule, causal or not, every ordering; and the transfers running
on streams of their own."""
import pytest

torch = pytest.importorskip("torch")
from flashlab import distributed, ops  # noqa: E402
from flashlab._torch_reference import materialized_attention  # noqa: E402

pytestmark = pytest.mark.gpu


def gradients(attention, q, k, v, d_out, causal):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = attention(*leaves, causal)
    out.backward(d_out)
    return out.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("ordering", distributed.ORDERINGS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("world_size", [2, 4])
def test_the_local_ring_keeps_the_rule_against_attention_on_the_gathered_tensors(world_size, ordering, causal):
    torch.manual_seed(world_size * 7 + causal)
    batch, heads, heads_kv, head_dim, n = 2, 8, 2, 128, 512
    shape = (batch, world_size * n, heads, head_dim)
    q = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, world_size * n, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    d_out = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    reference, reference_grads = gradients(lambda a, b, c, m: materialized_attention(a, b, c, m, torch.float32),
                                           q, k, v, d_out.float(), causal)
    naive, naive_grads = gradients(lambda a, b, c, m: materialized_attention(a, b, c, m, torch.bfloat16),
                                   q, k, v, d_out, causal)
    single, single_grads = gradients(lambda a, b, c, m: ops.flash_attn_func(a, b, c, causal=m), q, k, v, d_out, causal)

    shards = [[s.clone().requires_grad_() for s in distributed.shard_sequence(t, world_size, ordering)] for t in (q, k, v)]
    outs = distributed.local_ring_attention(*shards, causal=causal, ordering=ordering)
    torch.autograd.backward(outs, distributed.shard_sequence(d_out, world_size, ordering))
    out = distributed.gather_sequence([o.detach() for o in outs], ordering)
    ring_grads = [distributed.gather_sequence([p.grad for p in parts], ordering) for parts in shards]

    def error(x, y):
        return (x.float() - y.float()).abs().max().item()

    slack = 1e-5 + 2 * error(reference.to(torch.bfloat16), reference)  # the output format's own rounding
    assert error(out, reference) <= 2 * error(naive, reference) + slack, (error(out, reference), error(naive, reference))
    assert error(out, reference) <= 2 * error(single, reference) + slack, (error(out, reference), error(single, reference))
    for name, got, base, flash, want in zip("qkv", ring_grads, naive_grads, single_grads, reference_grads):
        assert error(got, want) <= 3 * error(base, want) + 1e-4, (f"d{name}", error(got, want), error(base, want))
        assert error(got, want) <= 3 * error(flash, want) + 1e-4, (f"d{name}", error(got, want), error(flash, want))


def test_the_ring_runs_flashlabs_kernels_on_streams_of_its_own():
    """The local attention is the kernels' (not the reference); each logical rank has its own
    stream and the copies a stream apart (the overlap is timed by scripts/ring_bench.py, not here)."""
    assert distributed.local_attention_generation("cuda") in ("fa2", "fa3")
    ring = distributed._LocalRing(4, "cuda")
    streams = {s.cuda_stream for s in ring.streams} | {ring.copy_stream.cuda_stream}
    assert len(streams) == 5 and torch.cuda.current_stream().cuda_stream not in streams
