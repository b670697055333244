"""FlashLab's attention kernels as PyTorch operators, with flash-attention's interface.

    from flashlab.ops import flash_attn_func, flash_attn_varlen_func
    out = flash_attn_func(q, k, v, causal=True)            # q [batch, seqlen_q, heads_q, head_dim]
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)

Both are `torch.library` custom operators (flashlab::attention_forward and
flashlab::attention_backward) with autograd and fake-tensor implementations, so they train and
`torch.compile` traces them without a graph break. The forward runs the kernel `generation` names:

    "fa2"        the FA2 forward (compute capability 8.0 and up)
    "fa3"        the FA3 forward (compute capability 9.0, a library built with sm_90a code)
    "fa1"        the FA1 forward (fp16, head_dim <= 128; compute capability 7.5 and up)
    "auto"       "fa3" on compute capability 9.0 when the library has its code, else "fa2"
    "reference"  plain PyTorch on any device and floating dtype (flashlab/_torch_reference.py):
                 for fp64 gradcheck and for CPU tensors; never chosen by "auto"

and the backward is the Hopper rung's backward after an "fa3" forward where it takes the head dim
(up to 256), the FA2 backward kernel otherwise (backward_generation; the reference's own backward
for "reference"). What a kernel refuses raises KernelRefused (a ValueError) with the kernel's own
message, naming the input and the allowed range; nothing falls back to another kernel. Kernels run
on the tensors' device and on torch's current stream there. LSE (return_lse=True) is fp32,
[batch, heads_q, seqlen_q] ([heads_q, total_q] for varlen), natural log, -inf for a row that sees
no key; it carries no gradient.

flash_attn_with_kvcache runs the decode rung (kernels/04_decode_sm80/): one to 16 query tokens
against a KV cache, contiguous or paged, with the new tokens appended; inference only (no
gradient).

torch is imported by this module only: `import flashlab` needs numpy alone.
"""
import operator
from typing import Optional

try:
    import torch
except ImportError as error:
    raise ImportError("flashlab.ops runs on PyTorch tensors and needs torch (pip install torch); the rest of "
                      "flashlab does not") from error

from flashlab import _abi, _torch_reference
from flashlab._abi import KernelError, KernelRefused, KernelsUnavailable

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "resolve_generation", "kernels_available",
           "KernelRefused", "KernelError", "KernelsUnavailable", "GENERATIONS"]

GENERATIONS = ("auto", "fa1", "fa2", "fa3", "reference")
_REFERENCE = 0
_KERNEL_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def kernels_available() -> bool:
    """Whether this installation has the CUDA kernel library (False for a build without CUDA)."""
    return _abi.available()


def resolve_generation(generation: str, device) -> str:
    """The kernel `generation` stands for on `device` ("auto" resolved by compute capability)."""
    return _resolve_generation(generation, str(device))


# Under torch.compile the answer is a constant of the trace: computed eagerly (it loads the kernel
# library and asks the device), never traced.
@torch.compiler.assume_constant_result
def _resolve_generation(generation: str, device: str) -> str:
    if generation not in GENERATIONS:
        raise ValueError(f"generation = {generation!r}; allowed: {', '.join(repr(g) for g in GENERATIONS)}")
    if generation == "reference":
        return generation
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"q is on {device}: generation {generation!r} runs a CUDA kernel; allowed: tensors on a "
                         "CUDA device, or generation='reference'")
    library = _abi.library()  # KernelsUnavailable in a build without CUDA
    if generation != "auto":
        return generation
    capability = torch.cuda.get_device_capability(device)
    if capability == (9, 0) and library.generation_built(_abi.GENERATION_CODES["fa3"]):
        return "fa3"
    if capability >= (8, 0):
        return "fa2"
    raise ValueError(f"{device} has compute capability {capability[0]}.{capability[1]}: generation 'auto' picks "
                     "fa3 (9.0) or fa2 (8.0 and up); allowed: such a device, or generation='fa1' (fp16, 7.5 and up)")


# ---------------------------------------------------------------------------------------------
# The custom operators. Their arguments are what the kernels take, already checked and resolved
# by the two public functions below.

@torch.library.custom_op("flashlab::attention_forward", mutates_args=())
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
                      cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                      softmax_scale: float, causal: bool, window_left: int, window_right: int,
                      deterministic: bool, generation: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse). generation: 0 the reference, 1-3 the kernel of that generation. deterministic is
    the backward's (kept here for autograd)."""
    if generation == _REFERENCE:
        return _torch_reference.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left,
                                        window_right)
    q, k, v = _heads_contiguous(q, k, v)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, cu_seqlens_q), dtype=torch.float32, device=q.device)
    with _KernelCall(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                     window_left, window_right) as call:
        call.library.forward(generation, call.problem, call.tensor(q), call.tensor(k), call.tensor(v),
                             call.tensor(out), call.lse(lse), call.stream)
    return out, lse


@attention_forward.register_fake
def _attention_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                            window_left, window_right, deterministic, generation):
    lse_dtype = _torch_reference.lse_dtype(q.dtype) if generation == _REFERENCE else torch.float32
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(_lse_shape(q, cu_seqlens_q),
                                                                                   dtype=lse_dtype)


def backward_generation(forward_generation: int, head_dim: int) -> int:
    """The backward kernel of a forward generation code: the Hopper rung's backward (3) after its
    forward where it takes the head dim (up to 256), the FA2 backward (2) otherwise."""
    return 3 if forward_generation == 3 and head_dim <= 256 else 2


@torch.library.custom_op("flashlab::attention_backward", mutates_args=())
def attention_backward(d_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
                       max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool, window_left: int,
                       window_right: int, deterministic: bool,
                       generation: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv): the backward kernel for the forward's generation (1-3; backward_generation) or the
    reference's backward (0)."""
    if generation == _REFERENCE:
        return _torch_reference.backward(d_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal,
                                         window_left, window_right)
    d_out, q, k, v, out = _heads_contiguous(d_out, q, k, v, out)
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    with _KernelCall(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                     window_left, window_right) as call:
        call.library.backward(backward_generation(generation, q.shape[-1]), call.problem, deterministic, call.tensor(q), call.tensor(k), call.tensor(v),
                              call.tensor(out), call.lse(lse), call.tensor(d_out), call.tensor(dq), call.tensor(dk),
                              call.tensor(dv), call.stream)
    return dq, dk, dv


@attention_backward.register_fake
def _attention_backward_fake(d_out, q, k, v, out, lse, *args):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k = inputs[:5]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.arguments = inputs[5:]  # max_seqlen_q ... generation
    ctx.mark_non_differentiable(lse)


def _backward(ctx, d_out, d_lse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    # The kernel takes any strides but a zero one (an expanded gradient, as sum() gives): copied then.
    dq, dk, dv = attention_backward(d_out.contiguous(), q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.arguments)
    return (dq, dk, dv) + (None,) * (5 + len(ctx.arguments) - 3)


attention_forward.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------------
# The public functions: flash-attention's names, layouts and checks.

def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    deterministic=False, return_lse=False, generation="auto"):
    """Attention over q [batch, seqlen_q, heads_q, head_dim], k and v [batch, seqlen_k, heads_kv,
    head_dim] (heads_q a multiple of heads_kv: GQA, MQA). softmax_scale: None for
    1/sqrt(head_dim). causal and window_size=(left, right) (-1: unbounded) are aligned to the
    bottom-right corner of the score matrix, as in flash-attention. deterministic: the backward's
    dQ in a fixed order (bitwise repeatable). Returns out like q, or (out, lse) with return_lse."""
    _require_tensors(q=q, k=k, v=v)
    _require_rank(4, "[batch, seqlen, heads, head_dim]", q=q, k=k, v=v)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k.shape[0] = {k.shape[0]} (batch) differs from q.shape[0] = {q.shape[0]}; allowed: equal")
    return _attention(q, k, v, None, None, q.shape[1], k.shape[1], dropout_p, softmax_scale, causal, window_size,
                      deterministic, return_lse, generation)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), deterministic=False,
                           return_lse=False, generation="auto"):
    """Attention over a batch of sequences of different lengths, packed: q [total_q, heads_q,
    head_dim], k and v [total_k, heads_kv, head_dim]; sequence b is rows cu_seqlens_q[b] to
    cu_seqlens_q[b + 1] of q (int32 tensors of batch + 1 offsets from 0, on q's device) and
    likewise of k and v. max_seqlen_q, max_seqlen_k: the longest sequences (or more). The rest as
    flash_attn_func; lse is [heads_q, total_q]. The kernels need the offsets on the host too: each
    call copies them there (a synchronisation)."""
    _require_tensors(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    _require_rank(3, "[total_rows, heads, head_dim]", q=q, k=k, v=v)
    for name, offsets in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if offsets.dtype != torch.int32 or offsets.dim() != 1 or offsets.shape[0] < 2:
            raise ValueError(f"{name}: {offsets.dtype}, shape {tuple(offsets.shape)}; allowed: a 1-D torch.int32 "
                             "tensor of batch + 1 >= 2 offsets")
        if offsets.device != q.device:
            raise ValueError(f"{name} is on {offsets.device}, q on {q.device}; allowed: the same device")
    if cu_seqlens_k.shape[0] != cu_seqlens_q.shape[0]:
        raise ValueError(f"cu_seqlens_k has {cu_seqlens_k.shape[0]} offsets, cu_seqlens_q {cu_seqlens_q.shape[0]}; "
                         "allowed: the same number (batch + 1)")
    max_seqlen_q = _integer("max_seqlen_q", max_seqlen_q, 1, "an int >= 1 (the longest sequence or more)")
    max_seqlen_k = _integer("max_seqlen_k", max_seqlen_k, 1, "an int >= 1 (the longest sequence or more)")
    return _attention(q, k, v, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), max_seqlen_q, max_seqlen_k,
                      dropout_p, softmax_scale, causal, window_size, deterministic, return_lse, generation)


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
               window_size, deterministic, return_lse, generation):
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p = {dropout_p}; allowed: 0.0 (FlashLab's kernels have no dropout)")
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}; allowed: the same device")
        if t.dtype != q.dtype:
            raise ValueError(f"{name}.dtype = {t.dtype}, q.dtype = {q.dtype}; allowed: the same dtype")
    if not q.dtype.is_floating_point:
        raise ValueError(f"q.dtype = {q.dtype}; allowed: a floating dtype")
    if v.shape != k.shape:
        raise ValueError(f"v.shape = {tuple(v.shape)}, k.shape = {tuple(k.shape)}; allowed: equal (head_dim_v = "
                         "head_dim)")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k's head_dim = {k.shape[-1]}, q's = {q.shape[-1]}; allowed: equal")
    heads_q, heads_kv = q.shape[-2], k.shape[-2]
    if heads_kv < 1 or heads_q % heads_kv != 0:
        raise ValueError(f"heads_q = {heads_q} is not a multiple of heads_kv = {heads_kv}; allowed: heads_kv "
                         "dividing heads_q (MHA, GQA, MQA)")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    elif not (isinstance(softmax_scale, (int, float)) and 0 < softmax_scale < float("inf")):
        raise ValueError(f"softmax_scale = {softmax_scale!r}; allowed: None (1/sqrt(head_dim)) or a positive number")
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"window_size = {window_size!r}; allowed: (left, right), each -1 (unbounded) or >= 0")
    window_size = tuple(_integer("window_size", w, -1, "(left, right), each -1 (unbounded) or >= 0",
                                 shown=window_size) for w in window_size)
    # A bound at least as long as both sequences hides nothing: unbounded, exactly (the ABI takes
    # bounds up to max(seqlen_q, seqlen_k)).
    longest = max(max_seqlen_q, max_seqlen_k)
    window_left, window_right = (-1 if w >= longest else w for w in window_size)
    code = _generation_code(_resolve_generation(generation, str(q.device)))
    if code != _REFERENCE and q.dtype not in _KERNEL_DTYPES:
        raise ValueError(f"q.dtype = {q.dtype}; allowed: torch.float16, torch.bfloat16 (the kernels), or "
                         "generation='reference' for any floating dtype")
    # The kernels read rows and heads through strides, but a head's elements must be contiguous.
    q, k, v = _heads_contiguous(q, k, v)
    out, lse = attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                                 float(softmax_scale), bool(causal), window_left, window_right, bool(deterministic),
                                 code)
    return (out, lse) if return_lse else out


def _integer(name, value, minimum, allowed, shown=None):
    """value as an int (any integer type, not bool) of at least `minimum`, or a ValueError naming it."""
    try:
        number = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        number = None
    if number is None or number < minimum:
        raise ValueError(f"{name} = {value if shown is None else shown!r}; allowed: {allowed}")
    return number


def _generation_code(name):
    return _REFERENCE if name == "reference" else _abi.GENERATION_CODES[name]


def _require_tensors(**tensors):
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} is a {type(t).__name__}; allowed: a torch.Tensor")


def _require_rank(rank, layout, **tensors):
    for name, t in tensors.items():
        if t.dim() != rank:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; allowed: {rank} dimensions, {layout}")


def _heads_contiguous(*tensors):
    """The tensors with each head's elements contiguous (the ABI's strides stop at the head), copied
    where they are not: flash_attn_func sees to it, and this holds it for any caller of the op."""
    return tuple(t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous() for t in tensors)


def _lse_shape(q, cu_seqlens_q):
    return (q.shape[1], q.shape[0]) if cu_seqlens_q is not None else (q.shape[0], q.shape[2], q.shape[1])


class _KernelCall:
    """One ABI call's problem, tensor views and stream, on the tensors' device.

    Dense tensors are [batch, seqlen, heads, dim] and LSE [batch, heads, seqlen]; varlen ones
    [rows, heads, dim] and LSE [heads, rows]. The ABI takes (batch, row, head) strides and the
    extents from the problem: the extents of every tensor were checked against q and k above, and
    the varlen offsets against the tensors' rows here."""

    def __init__(self, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                 window_left, window_right):
        self.library = _abi.library()
        self.device = q.device
        self.varlen = cu_seqlens_q is not None
        heads_q, heads_kv, head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
        common = dict(dtype=_KERNEL_DTYPES[q.dtype], heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim,
                      softmax_scale=softmax_scale, causal=causal, bottom_right=True,
                      window=(window_left, window_right))
        if self.varlen:
            offsets_q, offsets_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
            for name, offsets, rows in (("cu_seqlens_q", offsets_q, q.shape[0]), ("cu_seqlens_k", offsets_k,
                                                                                 k.shape[0])):
                if offsets[-1] > rows:
                    raise ValueError(f"{name}[-1] = {offsets[-1]} exceeds the {rows} rows of "
                                     f"{'q' if name.endswith('q') else 'k and v'}; allowed: at most that")
            # The host arrays live as long as this call.
            self._host_offsets = (_abi.int_array(offsets_q), _abi.int_array(offsets_k))
            self.problem = _abi.make_problem(batch=len(offsets_q) - 1, seqlen_q=max_seqlen_q, seqlen_k=max_seqlen_k,
                                             cu_seqlens_host=self._host_offsets,
                                             cu_seqlens_device=(cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()),
                                             **common)
        else:
            self.problem = _abi.make_problem(batch=q.shape[0], seqlen_q=q.shape[1], seqlen_k=k.shape[1], **common)

    def __enter__(self):
        self._guard = torch.cuda.device(self.device)
        self._guard.__enter__()
        self.stream = torch.cuda.current_stream(self.device).cuda_stream
        return self

    def __exit__(self, *exc):
        return self._guard.__exit__(*exc)

    def tensor(self, t):
        if self.varlen:
            return t.data_ptr(), (0, t.stride(0), t.stride(1))
        return t.data_ptr(), (t.stride(0), t.stride(1), t.stride(2))

    def lse(self, t):
        if self.varlen:
            return t.data_ptr(), (0, t.stride(1), t.stride(0))
        return t.data_ptr(), (t.stride(0), t.stride(2), t.stride(1))


# ---------------------------------------------------------------------------------------------
# Decoding against a KV cache: flash-attention's flash_attn_with_kvcache.

# Per (device, stream): a workspace whose leading counters are zero (the kernel leaves them so).
_decode_workspaces = {}


def _decode_workspace(device, stream, size):
    key = (device.index, stream)
    workspace = _decode_workspaces.get(key)
    if workspace is None or workspace.numel() < size:
        workspace = torch.zeros(max(size, 1), dtype=torch.uint8, device=device)
        _decode_workspaces[key] = workspace
    return workspace


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                            cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            alibi_slopes=None, num_splits=0, return_softmax_lse=False, check_inputs=True):
    """Decoding: q [batch, seqlen_q, heads_q, head_dim] (1..16 query tokens per sequence) against
    the KV cache k_cache, v_cache: contiguous [batch, seqlen_cache, heads_kv, head_dim], or paged
    [num_blocks, page_block_size, heads_kv, head_dim] with block_table [batch, max_blocks] (int32
    page ids; page_block_size 16, 32, 64, 128, 192 or 256). cache_seqlens: int32 [batch] (or an
    int): the keys cached per sequence. k, v [batch, seqlen_new, heads_kv, head_dim]: new tokens,
    written into the cache at cache_seqlens and attended to. causal: query token i sees keys
    j <= i + keys - seqlen_q of its sequence. num_splits: 0 (chosen for the GPU) or 1..256 chunks.
    Returns out like q, or (out, softmax_lse [batch, heads_q, seqlen_q], fp32) with
    return_softmax_lse. check_inputs (FlashLab's own): copy cache_seqlens and block_table to the
    host to refuse lengths beyond the cache and page ids out of range before the launch (a
    synchronisation); False trusts them. What flash-attention's function has and FlashLab does not
    (rotary, cache_batch_idx, cache_leftpad, windows, softcap, ALiBi) is refused by name."""
    for name, value, absent in (("rotary_cos", rotary_cos, None), ("rotary_sin", rotary_sin, None),
                                ("cache_batch_idx", cache_batch_idx, None), ("cache_leftpad", cache_leftpad, None),
                                ("alibi_slopes", alibi_slopes, None), ("softcap", softcap, 0.0)):
        if value is not absent and not (absent == 0.0 and value == 0.0):
            raise ValueError(f"{name} = {value!r}; allowed: {absent!r} (not supported by FlashLab's decode kernel)")
    if tuple(window_size) != (-1, -1):
        raise ValueError(f"window_size = {window_size!r}; allowed: (-1, -1) (no window)")
    _require_tensors(q=q, k_cache=k_cache, v_cache=v_cache)
    _require_rank(4, "[batch, seqlen, heads, head_dim]", q=q, k_cache=k_cache, v_cache=v_cache)
    if q.dtype not in _KERNEL_DTYPES:
        raise ValueError(f"q.dtype = {q.dtype}; allowed: torch.float16, torch.bfloat16")
    batch, seqlen_q, heads_q, head_dim = q.shape
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache.shape = {tuple(v_cache.shape)}, k_cache.shape = {tuple(k_cache.shape)}; allowed: equal")
    heads_kv = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache's head_dim = {k_cache.shape[3]}, q's = {head_dim}; allowed: equal")
    tensors = dict(k_cache=k_cache, v_cache=v_cache)
    seqlen_new = 0
    if (k is None) != (v is None):
        raise ValueError("k and v: one is given; allowed: both (new tokens) or neither")
    if k is not None:
        _require_tensors(k=k, v=v)
        _require_rank(4, "[batch, seqlen_new, heads_kv, head_dim]", k=k, v=v)
        if k.shape != v.shape or k.shape[0] != batch or k.shape[2:] != k_cache.shape[2:]:
            raise ValueError(f"k.shape = {tuple(k.shape)}, v.shape = {tuple(v.shape)}; allowed: equal, "
                             f"[{batch}, seqlen_new, {heads_kv}, {head_dim}]")
        seqlen_new = k.shape[1]
        tensors.update(k=k, v=v)
    for name, t in tensors.items():
        if t.device != q.device or t.dtype != q.dtype:
            raise ValueError(f"{name} is {t.dtype} on {t.device}, q {q.dtype} on {q.device}; allowed: q's dtype and device")
    if cache_seqlens is None:
        raise ValueError("cache_seqlens is None; allowed: an int32 tensor of batch lengths, or an int")
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    _require_tensors(cache_seqlens=cache_seqlens)
    if cache_seqlens.dtype != torch.int32 or tuple(cache_seqlens.shape) != (batch,) or cache_seqlens.device != q.device:
        raise ValueError(f"cache_seqlens: {cache_seqlens.dtype}, shape {tuple(cache_seqlens.shape)} on "
                         f"{cache_seqlens.device}; allowed: torch.int32 [{batch}] on {q.device}")
    cache_seqlens = cache_seqlens.contiguous()
    paged = block_table is not None
    if paged:
        _require_tensors(block_table=block_table)
        if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != batch \
                or block_table.device != q.device:
            raise ValueError(f"block_table: {block_table.dtype}, shape {tuple(block_table.shape)} on "
                             f"{block_table.device}; allowed: torch.int32 [{batch}, max_blocks] on {q.device}")
        block_table = block_table.contiguous()
        page_size, num_pages, max_pages = k_cache.shape[1], k_cache.shape[0], block_table.shape[1]
        seqlen_k = max_pages * page_size
    else:
        if k_cache.shape[0] != batch:
            raise ValueError(f"k_cache.shape[0] = {k_cache.shape[0]}; allowed: batch = {batch} (a contiguous cache)")
        page_size = num_pages = max_pages = 0
        seqlen_k = k_cache.shape[1]
    if softmax_scale is None:
        softmax_scale = head_dim ** -0.5
    elif not (isinstance(softmax_scale, (int, float)) and 0 < softmax_scale < float("inf")):
        raise ValueError(f"softmax_scale = {softmax_scale!r}; allowed: None (1/sqrt(head_dim)) or a positive number")
    num_splits = _integer("num_splits", num_splits, 0, "0 (chosen for the GPU) or 1..256")
    q, k_cache, v_cache = _heads_contiguous(q, k_cache, v_cache)
    if seqlen_new:
        k, v = _heads_contiguous(k, v)
    host = []
    if check_inputs:
        host.append(_abi.int_array(cache_seqlens.tolist()))
        if paged:
            host.append(_abi.int_array(block_table.flatten().tolist()))

    library = _abi.library()
    out = torch.empty_like(q)
    lse = torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32, device=q.device)
    pointer = lambda t: (t.data_ptr(), (t.stride(0), t.stride(1), t.stride(2)))
    problem = _abi.make_problem(dtype=_KERNEL_DTYPES[q.dtype], batch=batch, heads_q=heads_q, heads_kv=heads_kv,
                                seqlen_q=seqlen_q, seqlen_k=seqlen_k, head_dim=head_dim, softmax_scale=softmax_scale,
                                causal=bool(causal), bottom_right=True)
    cache = _abi.make_kv_cache(
        k_cache=pointer(k_cache), v_cache=pointer(v_cache), cache_seqlens=cache_seqlens.data_ptr(),
        block_table=block_table.data_ptr() if paged else None, page_size=page_size, num_pages=num_pages,
        max_pages_per_sequence=max_pages, k_new=pointer(k) if seqlen_new else None,
        v_new=pointer(v) if seqlen_new else None, seqlen_new=seqlen_new,
        host_cache_seqlens=host[0] if host else None, host_block_table=host[1] if len(host) > 1 else None)

    def launch(stream):
        size = library.decode_workspace_bytes(problem, cache, num_splits)
        workspace = _decode_workspace(q.device, stream, size) if size else None
        library.decode(problem, cache, num_splits, pointer(q), pointer(out),
                       (lse.data_ptr(), (lse.stride(0), lse.stride(2), lse.stride(1))),
                       workspace.data_ptr() if workspace is not None else 0, size, False, stream)
    _on_device(q.device, launch)
    return (out, lse) if return_softmax_lse else out


def _on_device(device, launch):
    """launch(stream) on torch's current stream of the CUDA device `device`."""
    if device.type != "cuda":
        raise ValueError(f"q is on {device}; allowed: a CUDA device")
    with torch.cuda.device(device):
        launch(torch.cuda.current_stream(device).cuda_stream)
