"""Ring Attention across GPUs (Liu, Zaharia and Abbeel 2023): exact attention over a sequence split
between ranks, with the key/value blocks passed around a ring over NCCL.

    import torch.distributed as dist
    from flashlab.distributed import ring_attention, shard_sequence
    dist.init_process_group("nccl")                       # one process per GPU (torchrun)
    q, k, v = (shard_sequence(t, dist.get_world_size(), "zigzag")[dist.get_rank()] for t in (q_all, k_all, v_all))
    out = ring_attention(q, k, v, causal=True)            # this rank's shard of the output; autograd works

Each rank keeps its query shard in place; at step s rank i holds the key/value shard of rank
(i - s) mod P, runs FlashLab's attention kernel on it (flashlab.ops, which returns O and LSE) while
the next shard travels from rank i - 1 (torch.distributed.batch_isend_irecv, on NCCL's stream, so
the transfer overlaps the kernel), and merges the block's O and LSE into its running result by the
log-sum-exp combine. The backward runs the backward kernel per block with the final LSE and sends
dK, dV (fp32) around the ring with K, V, one hop behind, so that they arrive home after P steps.
This is the schedule algorithms/12_ring_attention.hpp models and checks on the CPU; its block pairs
are the ones written there, for the three orderings:

    contiguous  rank i holds positions [i n, (i + 1) n): the paper's layout (a causal mask leaves
                the first ranks idle for most steps);
    striped     rank i holds positions i, i + P, i + 2P, ... (Striped Attention, Brandon et al. 2023);
    zigzag      the sequence in 2P chunks, rank i holding chunks i and 2P - 1 - i (as
                context-parallel training does): with a causal mask every rank does half a block's
                work at every step.

Shards are [batch, n, heads, head_dim], n the same on every rank (striped: N = P n; zigzag: n even).
shard_sequence and gather_sequence lay a whole sequence out and back.

On one GPU, local_ring_attention runs the same ring with P logical ranks, each on its own CUDA
stream, with device-to-device copies on a copy stream in place of NCCL: the schedule, the overlap
and the merge can be tested before several GPUs are at hand. On CPU tensors it runs the same steps
without streams.

The local attention: generation "auto" runs FlashLab's kernels (the Hopper rung's forward on an
H100/H200 where the library has it, FA2's otherwise; their backward); where the package was built
without its kernels, or on CPU tensors, it runs the PyTorch reference (flashlab/_torch_reference.py)
and says so with a RuntimeWarning (CUDA) — never a silent fallback. local_attention_generation tells
which one a device gets.
"""
import warnings
from dataclasses import dataclass

try:
    import torch
    import torch.distributed as dist
except ImportError as error:
    raise ImportError("flashlab.distributed runs on PyTorch tensors and needs torch (pip install torch)") from error

from flashlab import ops

__all__ = ["ring_attention", "local_ring_attention", "shard_sequence", "gather_sequence", "shard_positions",
           "block_pairs", "merge_by_lse", "local_attention_generation", "ORDERINGS"]

ORDERINGS = ("contiguous", "striped", "zigzag")


# ---------------------------------------------------------------------------------------------
# Layouts and block pairs

def _require_ordering(ordering):
    if ordering not in ORDERINGS:
        raise ValueError(f"ordering = {ordering!r}; allowed: {', '.join(repr(o) for o in ORDERINGS)}")


def _require_shard_length(n, world_size, ordering, what="the shard length"):
    if n < 1:
        raise ValueError(f"{what} = {n}; allowed: >= 1")
    if ordering == "zigzag" and n % 2 != 0:
        raise ValueError(f"{what} = {n} with ordering 'zigzag'; allowed: even (two chunks per rank)")


def shard_positions(rank, world_size, n, ordering):
    """The sequence positions rank `rank` holds, in order, for shards of n tokens (a list of ints)."""
    _require_ordering(ordering)
    if ordering == "contiguous":
        return list(range(rank * n, (rank + 1) * n))
    if ordering == "striped":
        return list(range(rank, world_size * n, world_size))
    half = n // 2
    late = 2 * world_size - 1 - rank
    return list(range(rank * half, (rank + 1) * half)) + list(range(late * half, (late + 1) * half))


def shard_sequence(x, world_size, ordering, dim=1):
    """The world_size shards of a whole sequence x (its length along `dim` a multiple of
    world_size; of 2 world_size for zigzag), each holding the positions shard_positions gives."""
    _require_ordering(ordering)
    length = x.shape[dim]
    parts = world_size * (2 if ordering == "zigzag" else 1)
    if world_size < 1 or length % parts != 0:
        raise ValueError(f"a sequence of {length} tokens over {world_size} ranks ({ordering}); allowed: a length that is "
                         f"a multiple of {parts}")
    n = length // world_size
    index = [torch.tensor(shard_positions(r, world_size, n, ordering), device=x.device) for r in range(world_size)]
    return [x.index_select(dim, i) for i in index]


def gather_sequence(shards, ordering, dim=1):
    """The whole sequence back from its shards (shard_sequence's inverse)."""
    _require_ordering(ordering)
    world_size, n = len(shards), shards[0].shape[dim]
    positions = torch.tensor([p for r in range(world_size) for p in shard_positions(r, world_size, n, ordering)],
                             device=shards[0].device)
    stacked = torch.cat(list(shards), dim=dim)
    return stacked.index_select(dim, torch.argsort(positions))


def block_pairs(rank, block, world_size, n, ordering, causal):
    """The attention calls rank `rank` makes on the key/value shard of rank `block`: a list of
    (query rows, key rows, causal) with rows as slices of the shards. Without a mask, one full
    call. With one: the block pairs of algorithms/12_ring_attention.hpp for equal shards, each a
    full block or a square causal one; a pair the mask hides is left out (no call)."""
    everything = slice(0, n)
    if not causal:
        return [(everything, everything, False)]
    if ordering == "contiguous":
        return [(everything, everything, rank == block)] if block <= rank else []
    if ordering == "striped":
        if block <= rank:  # positions rank + P a see block + P b iff b <= a
            return [(everything, everything, True)]
        # block > rank: b <= a - 1, so query 0 sees nothing and key n - 1 is seen by no query
        return [(slice(1, n), slice(0, n - 1), True)] if n > 1 else []
    half = n // 2
    if block == rank:  # both chunks against both: the same positions on both sides
        return [(everything, everything, True)]
    if block < rank:  # both query chunks see the early key chunk whole, the late one not at all
        return [(everything, slice(0, half), False)]
    return [(slice(half, n), everything, False)]  # the late query chunk sees both key chunks whole


def merge_by_lse(out, lse, block_out, block_lse):
    """In place: (out, lse) and a block's (block_out, block_lse) of the same rows merged by
    log-sum-exp: lse' = log(e^lse + e^block_lse), out' = e^(lse - lse') out + e^(block_lse - lse')
    block_out. out [batch, rows, heads, d] (fp32), lse [batch, heads, rows] (fp32); a row of lse
    -inf takes the block's whole. The combine of online_softmax.hpp (combine_by_lse)."""
    new_lse = torch.logaddexp(lse, block_lse)
    finite = torch.isfinite(new_lse)
    safe = torch.where(finite, new_lse, torch.zeros_like(new_lse))
    weight = torch.where(finite, torch.exp(lse - safe), torch.zeros_like(lse)).transpose(1, 2).unsqueeze(-1)
    block_weight = torch.where(finite, torch.exp(block_lse - safe), torch.zeros_like(lse)).transpose(1, 2).unsqueeze(-1)
    out.mul_(weight).add_(block_out.to(out.dtype) * block_weight)
    lse.copy_(new_lse)


def local_attention_generation(device, generation="auto"):
    """The generation flashlab.ops runs for a ring's blocks on `device`: the kernels' ("fa3" on an
    H100/H200 where built, "fa2" otherwise) on CUDA with the kernel library; "reference" on the CPU
    or where the package has no kernels (with a RuntimeWarning on CUDA)."""
    device = torch.device(device)
    if generation != "auto":
        return ops.resolve_generation(generation, device)
    if device.type != "cuda":
        return "reference"
    if not ops.kernels_available():
        warnings.warn("flashlab.distributed: this flashlab was built without its CUDA kernels; the ring's local "
                      "attention runs the PyTorch reference (flashlab/_torch_reference.py)", RuntimeWarning,
                      stacklevel=3)
        return "reference"
    return ops.resolve_generation("auto", device)


# ---------------------------------------------------------------------------------------------
# One rank's steps. A rank's work is a generator that yields where it waits for the ring, so one
# process (NCCL: one rank) and one GPU (P logical ranks, in lockstep) run the same code.

@dataclass
class _Ring:
    world_size: int
    ordering: str
    causal: bool
    scale: float
    generation: str


def _attention_forward(ring, q, k, v, causal):
    out, lse = ops.flash_attn_func(q, k, v, softmax_scale=ring.scale, causal=causal, return_lse=True,
                                   generation=ring.generation)
    return out, lse


def _attention_backward(ring, d_out, q, k, v, out, lse, causal):
    code = 0 if ring.generation == "reference" else ops._abi.GENERATION_CODES[ring.generation]
    q, k, v, out, d_out = (t.contiguous() for t in (q, k, v, out, d_out))
    return ops.attention_backward(d_out, q, k, v, out, lse.contiguous(), None, None, q.shape[1], k.shape[1],
                                  float(ring.scale), bool(causal), -1, -1, False, code)


def _forward_steps(ring, rank, comm, q, k, v, result):
    """Rank `rank`'s forward; result gets (out in q's dtype, lse fp32)."""
    n = q.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float32 if q.dtype != torch.float64 else q.dtype, device=q.device)
    lse = torch.full((q.shape[0], q.shape[2], n), float("-inf"), dtype=out.dtype, device=q.device)
    kv = (k, v)
    for step in range(ring.world_size):
        block = (rank - step) % ring.world_size
        pending = comm.send_recv(rank, step, kv) if step + 1 < ring.world_size else None  # overlapped
        for rows, keys, causal in block_pairs(rank, block, ring.world_size, n, ring.ordering, ring.causal):
            block_out, block_lse = _attention_forward(ring, q[:, rows], kv[0][:, keys], kv[1][:, keys], causal)
            merge_by_lse(out[:, rows], lse[:, :, rows], block_out, block_lse.to(lse.dtype))
        if pending is not None:
            yield
            kv = pending.wait()
    result.extend([out.to(q.dtype), lse])


def _backward_steps(ring, rank, comm, d_out, q, k, v, out, lse, result):
    """Rank `rank`'s backward; result gets (dq, dk, dv) in the inputs' dtype."""
    n = q.shape[1]
    accumulate = torch.float32 if q.dtype != torch.float64 else q.dtype
    dq = torch.zeros(q.shape, dtype=accumulate, device=q.device)
    kv, dkv = (k, v), None
    for step in range(ring.world_size):
        block = (rank - step) % ring.world_size
        pending_kv = comm.send_recv(rank, 2 * step, kv) if step + 1 < ring.world_size else None
        dk_block = torch.zeros(kv[0].shape, dtype=accumulate, device=q.device)
        dv_block = torch.zeros(kv[1].shape, dtype=accumulate, device=q.device)
        for rows, keys, causal in block_pairs(rank, block, ring.world_size, n, ring.ordering, ring.causal):
            dq_pair, dk_pair, dv_pair = _attention_backward(ring, d_out[:, rows], q[:, rows], kv[0][:, keys],
                                                            kv[1][:, keys], out[:, rows], lse[:, :, rows], causal)
            dq[:, rows] += dq_pair
            dk_block[:, keys] += dk_pair
            dv_block[:, keys] += dv_pair
        if dkv is not None:  # dK, dV of this block so far, from rank - 1 (sent while this step computed)
            received = dkv.wait()
            dk_block += received[0]
            dv_block += received[1]
        dkv = comm.send_recv(rank, 2 * step + 1, (dk_block, dv_block))  # on to rank + 1; home after the last step
        yield
        if pending_kv is not None:
            kv = pending_kv.wait()
    dk, dv = dkv.wait()
    result.extend([dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)])


# ---------------------------------------------------------------------------------------------
# Communication: NCCL (one rank per process) or copies on one device (P logical ranks)

class _NcclPending:
    def __init__(self, works, received):
        self.works, self.received = works, received

    def wait(self):
        for work in self.works:
            work.wait()  # the current stream waits for NCCL's
        return self.received


class _NcclRing:
    """Point-to-point sends to rank + 1 and receives from rank - 1 of a process group."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.world_size) if group is not None else \
            (self.rank + 1) % self.world_size
        self.previous = dist.get_global_rank(group, (self.rank - 1) % self.world_size) if group is not None else \
            (self.rank - 1) % self.world_size

    def send_recv(self, rank, tag, tensors):
        if self.world_size == 1:  # a ring of one: the block comes back to itself
            return _NcclPending([], tuple(t.clone() for t in tensors))
        tensors = tuple(t.contiguous() for t in tensors)
        received = tuple(torch.empty_like(t) for t in tensors)
        operations = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        operations += [dist.P2POp(dist.irecv, t, self.previous, self.group) for t in received]
        return _NcclPending(dist.batch_isend_irecv(operations), received)


class _CopyPending:
    def __init__(self, mailbox, key):
        self.mailbox, self.key = mailbox, key

    def wait(self):
        tensors, event = self.mailbox.pop(self.key)
        if event is not None:
            stream = torch.cuda.current_stream(tensors[0].device)
            stream.wait_event(event)
            for t in tensors:
                t.record_stream(stream)
        return tensors


class _LocalRing:
    """P logical ranks on one device: rank r's send to r + 1 is a device-to-device copy on a copy
    stream (CUDA), issued when the block is ready on r's stream and waited for on r + 1's."""

    def __init__(self, world_size, device):
        self.world_size = world_size
        self.cuda = torch.device(device).type == "cuda"
        self.mailbox = {}
        self.copy_stream = torch.cuda.Stream(device=device) if self.cuda else None
        self.streams = [torch.cuda.Stream(device=device) for _ in range(world_size)] if self.cuda else None

    def send_recv(self, rank, tag, tensors):
        receiver = (rank + 1) % self.world_size
        if not self.cuda:
            self.mailbox[(receiver, tag)] = (tuple(t.clone() for t in tensors), None)
            return _CopyPending(self.mailbox, (rank, tag))
        ready = torch.cuda.current_stream(tensors[0].device).record_event()
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_event(ready)
            copies = tuple(t.clone() for t in tensors)
            for t in tensors:
                t.record_stream(self.copy_stream)
            arrived = self.copy_stream.record_event()
        self.mailbox[(receiver, tag)] = (copies, arrived)
        return _CopyPending(self.mailbox, (rank, tag))

    def run(self, generators, results):
        """Every rank's generator in lockstep, each on its own stream; then the caller's stream
        waits for them and owns the tensors in `results`."""
        if self.cuda:
            caller = torch.cuda.current_stream()
            for stream in self.streams:
                stream.wait_stream(caller)  # the inputs are ready on the caller's stream
        live = list(enumerate(generators))
        while live:
            still = []
            for rank, steps in live:
                with torch.cuda.stream(self.streams[rank]) if self.cuda else _no_stream():
                    try:
                        next(steps)
                        still.append((rank, steps))
                    except StopIteration:
                        pass
            live = still
        if self.cuda:
            for stream in self.streams:
                caller.wait_stream(stream)
            for tensors in results:
                for t in tensors:
                    t.record_stream(caller)


class _no_stream:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _drain(steps):
    for _ in steps:
        pass


# ---------------------------------------------------------------------------------------------
# Autograd

class _RingAttention(torch.autograd.Function):
    """One rank of a ring over a process group."""

    @staticmethod
    def forward(ctx, q, k, v, ring, comm):
        result = []
        _drain(_forward_steps(ring, comm.rank, comm, q, k, v, result))
        out, lse = result
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.comm = ring, comm
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        result = []
        _drain(_backward_steps(ctx.ring, ctx.comm.rank, ctx.comm, d_out.contiguous(), q, k, v, out, lse, result))
        return result[0], result[1], result[2], None, None


class _LocalRingAttention(torch.autograd.Function):
    """P logical ranks: inputs q_0 .. q_{P-1}, k_0 .., v_0 ..; outputs out_0 .. out_{P-1}."""

    @staticmethod
    def forward(ctx, ring, *shards):
        P = ring.world_size
        qs, ks, vs = shards[:P], shards[P:2 * P], shards[2 * P:]
        comm = _LocalRing(P, qs[0].device)
        results = [[] for _ in range(P)]
        comm.run([_forward_steps(ring, r, comm, qs[r], ks[r], vs[r], results[r]) for r in range(P)], results)
        outs = [r[0] for r in results]
        ctx.save_for_backward(*qs, *ks, *vs, *outs, *[r[1] for r in results])
        ctx.ring = ring
        return tuple(outs)

    @staticmethod
    def backward(ctx, *d_outs):
        ring = ctx.ring
        P = ring.world_size
        saved = ctx.saved_tensors
        qs, ks, vs, outs, lses = (saved[i * P:(i + 1) * P] for i in range(5))
        comm = _LocalRing(P, qs[0].device)
        results = [[] for _ in range(P)]
        d_outs = [d.contiguous() if d is not None else torch.zeros_like(o) for d, o in zip(d_outs, outs)]
        comm.run([_backward_steps(ring, r, comm, d_outs[r], qs[r], ks[r], vs[r], outs[r], lses[r], results[r])
                  for r in range(P)], results)
        return (None, *[r[0] for r in results], *[r[1] for r in results], *[r[2] for r in results])


# ---------------------------------------------------------------------------------------------
# The public functions

def _check_shards(q, k, v, world_size, ordering):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: {type(t).__name__} of shape {tuple(getattr(t, 'shape', ()))}; allowed: a "
                             "torch.Tensor [batch, seqlen_local, heads, head_dim]")
    if k.shape[1] != q.shape[1] or v.shape[:2] != k.shape[:2]:
        raise ValueError(f"shards of q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; allowed: the same batch "
                         "and seqlen_local (self-attention over one sequence)")
    _require_ordering(ordering)
    _require_shard_length(q.shape[1], world_size, ordering, "seqlen_local")


def _make_ring(q, world_size, ordering, causal, softmax_scale, generation):
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    return _Ring(world_size, ordering, bool(causal), float(softmax_scale),
                 local_attention_generation(q.device, generation))


def ring_attention(q, k, v, causal=False, group=None, ordering="zigzag", softmax_scale=None, generation="auto"):
    """Exact attention over a sequence split between the ranks of `group` (default: the world):
    q, k, v are this rank's shards [batch, seqlen_local, heads, head_dim] (k, v with heads_kv
    dividing heads: GQA), laid out by `ordering` (shard_sequence). Returns this rank's shard of
    the output; differentiable (torch.autograd). The ranks pass K, V (and in the backward dK, dV)
    to the next rank over torch.distributed (NCCL for CUDA tensors)."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("ring_attention needs torch.distributed initialised (dist.init_process_group); allowed: "
                         "a process group, or local_ring_attention for P logical ranks on one device")
    comm = _NcclRing(group)
    _check_shards(q, k, v, comm.world_size, ordering)
    ring = _make_ring(q, comm.world_size, ordering, causal, softmax_scale, generation)
    return _RingAttention.apply(q, k, v, ring, comm)


def local_ring_attention(qs, ks, vs, causal=False, ordering="zigzag", softmax_scale=None, generation="auto"):
    """The ring of ring_attention with P = len(qs) logical ranks on one device: qs[r], ks[r], vs[r]
    are rank r's shards. Returns the P output shards; differentiable. On CUDA each rank runs on its
    own stream and the blocks travel by device-to-device copies on a copy stream."""
    if not (len(qs) == len(ks) == len(vs)) or len(qs) < 1:
        raise ValueError(f"{len(qs)} q, {len(ks)} k and {len(vs)} v shards; allowed: as many of each, at least one")
    for q, k, v in zip(qs, ks, vs):
        _check_shards(q, k, v, len(qs), ordering)
        if q.shape != qs[0].shape or k.shape != ks[0].shape or q.device != qs[0].device:
            raise ValueError(f"a shard of shape {tuple(q.shape)} on {q.device} beside {tuple(qs[0].shape)} on "
                             f"{qs[0].device}; allowed: equal shards on one device")
    ring = _make_ring(qs[0], len(qs), ordering, causal, softmax_scale, generation)
    return list(_LocalRingAttention.apply(ring, *qs, *ks, *vs))
