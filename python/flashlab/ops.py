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
(up to 128), the FA2 backward kernel otherwise (backward_generation; the reference's own backward
for "reference"). What a kernel refuses raises KernelRefused (a ValueError) with the kernel's own
message, naming the input and the allowed range; nothing falls back to another kernel. Kernels run
on the tensors' device and on torch's current stream there. LSE (return_lse=True) is fp32,
[batch, heads_q, seqlen_q] ([heads_q, total_q] for varlen), natural log, -inf for a row that sees
no key; it carries no gradient.

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

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "resolve_generation", "kernels_available",
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
    forward where it takes the head dim (up to 128), the FA2 backward (2) otherwise."""
    return 3 if forward_generation == 3 and head_dim <= 128 else 2


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
