"""flashlab.testing: the reference-test library (tests/reference/, docs/reference_tests.md) for any
attention implementation callable on torch tensors: ours, PyTorch's SDPA, an outside kernel.

    from flashlab import testing
    result = testing.check(testing.flashlab_ops("fa2"))          # the default grid, bf16, on CUDA
    print(result.summary()); assert result.ok
    result = testing.check(my_attention, backward=True)          # gradients through autograd

The rule, the inputs and the reports are the C++ library's own (flashlab._core.testing), so the
two sides cannot drift: for every problem of the grid, fresh standard-normal inputs (a new seed
per case, printed in the report; FLASHLAB_TEST_SEED replays one) rounded to the dtype, then
  forward   max |O - oracle| <= 2 x max |O_naive - oracle| + slack (at least rounding_slack: the
            output format's own rounding of the reference), the same for LSE, fully masked rows
            exactly O = 0 and LSE = -inf, and a second run bitwise identical;
  backward  dQ, dK, dV within 3 x the naive same-precision backward's error + 1e-4,
where the oracle is attention in double precision and "naive" is attention the way a framework
computes it in the problem's dtype. A ValueError the implementation raises is recorded as
refused, with its message, never as a pass.

An implementation is called as fn(q, k, v, case) and returns out, or (out, lse), in
flash-attention's layouts: q [batch, seqlen_q, heads_q, head_dim], k and v [batch, seqlen_k,
heads_kv, head_dim], lse [batch, heads_q, seqlen_q]; for a varlen case q [total_q, heads_q,
head_dim], k, v [total_k, heads_kv, head_dim], lse [heads_q, total_q]. `case` (a Case) says what
to compute: case.flash_kwargs() are flash-attention's keyword arguments for it,
case.visible_keys(b) the mask of sequence b as a bool tensor. An implementation without LSE (SDPA)
is checked with check_lse=False. For backward=True the gradients come from torch.autograd on the
returned out.

torch is imported when a check runs, not when this module is imported.
"""
from dataclasses import dataclass, field

import numpy as np

from flashlab import _core

_rule = _core.testing

__all__ = ["check", "default_grid", "odd_shapes", "Case", "Result", "flashlab_ops", "sdpa", "rounding_slack",
           "within_rule", "compare", "describe"]

ForwardCase = _rule.ForwardCase
BackwardCase = _rule.BackwardCase
rounding_slack = _rule.rounding_slack
within_rule = _rule.within_rule
compare = _rule.compare
describe = _rule.describe

DEFAULT_HEAD_DIMS = (40, 59, 64, 96, 111, 128, 256)


def default_grid(dtype="bf16", head_dims=DEFAULT_HEAD_DIMS):
    """The C++ default grid (40 cases): the official odd (seqlen_q, seqlen_k) shapes, each with no
    mask, causal bottom-right and causal top-left; head dims cycling through `head_dims` with MHA
    (2/2 heads), GQA (4/2) and MQA (3/1); five sliding windows; two varlen batches."""
    return list(_rule.default_forward_grid(dtype, list(head_dims)))


def odd_shapes():
    """The official tests' odd (seqlen_q, seqlen_k) shapes."""
    return list(_rule.official_odd_shapes())


def _torch():
    try:
        import torch  # noqa: PLC0415 - imported when a check runs
    except ImportError as error:
        raise ImportError("flashlab.testing.check runs implementations on torch tensors; install torch") from error
    return torch


_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


class Case:
    """One problem of the grid as an implementation sees it: shapes, mask and scale, and helpers
    to call a flash-attention-style function or build a mask."""

    def __init__(self, problem, device):
        torch = _torch()
        self.problem = problem
        self.device = torch.device(device)
        fields = _rule.problem_fields(problem)
        self.dtype = getattr(torch, _DTYPES[fields["dtype"]])
        self.batch, self.heads_q, self.heads_kv = fields["batch"], fields["heads_q"], fields["heads_kv"]
        self.seqlen_q, self.seqlen_k, self.head_dim = fields["seqlen_q"], fields["seqlen_k"], fields["head_dim"]
        self.softmax_scale = fields["softmax_scale"]
        self.causal, self.bottom_right = fields["causal"], fields["bottom_right"]
        self.window_size = (fields["window_left"], fields["window_right"])
        self.varlen = fields["varlen"]
        self.sequence_lengths = [tuple(x) for x in fields["sequence_lengths"]]
        self.cu_seqlens_q = self.cu_seqlens_k = None
        if self.varlen:
            self.cu_seqlens_q = torch.tensor(fields["cu_seqlens_q"], dtype=torch.int32, device=self.device)
            self.cu_seqlens_k = torch.tensor(fields["cu_seqlens_k"], dtype=torch.int32, device=self.device)
        self._offsets = (fields["cu_seqlens_q"], fields["cu_seqlens_k"])

    def __repr__(self):
        return f"Case({describe(self.problem)})"

    def flash_kwargs(self):
        """flash-attention's keyword arguments for this case (flash_attn_varlen_func's for a varlen
        one). Raises ValueError (a refusal) where that interface cannot say it: a top-left causal
        alignment on a sequence with seqlen_q != seqlen_k (flash-attention aligns bottom-right)."""
        masked = self.causal or self.window_size != (-1, -1)
        if masked and not self.bottom_right and any(q != k for q, k in self.sequence_lengths):
            raise ValueError("a top-left mask alignment with seqlen_q != seqlen_k: flash-attention's interface "
                             "aligns masks bottom-right; allowed there: bottom-right, or seqlen_q == seqlen_k")
        kwargs = dict(softmax_scale=self.softmax_scale, causal=self.causal, window_size=self.window_size)
        if self.varlen:
            kwargs.update(cu_seqlens_q=self.cu_seqlens_q, cu_seqlens_k=self.cu_seqlens_k,
                          max_seqlen_q=self.seqlen_q, max_seqlen_k=self.seqlen_k)
        return kwargs

    def visible_keys(self, batch_index):
        """[seqlen_q, seqlen_k] of sequence `batch_index`, True where the query sees the key (the
        C++ mask rule, either alignment), on the case's device."""
        torch = _torch()
        return torch.from_numpy(np.array(_rule.visible_keys(self.problem, batch_index))).to(self.device)

    def sequences(self, q, k, v):
        """(q, k, v) of each sequence, [seqlen, heads, dim] each (rows of the packed tensors for varlen)."""
        if not self.varlen:
            return [(q[b], k[b], v[b]) for b in range(self.batch)]
        offsets_q, offsets_k = self._offsets
        return [(q[offsets_q[b]:offsets_q[b + 1]], k[offsets_k[b]:offsets_k[b + 1]], v[offsets_k[b]:offsets_k[b + 1]])
                for b in range(self.batch)]

    # Conversions between the C++ library's [rows, heads, dim] arrays and the implementation's layouts.
    def _to_torch(self, array, heads, query_side):
        torch = _torch()
        t = torch.from_numpy(array).to(device=self.device, dtype=self.dtype)
        if not self.varlen:
            t = t.reshape(self.batch, self.seqlen_q if query_side else self.seqlen_k, heads, self.head_dim)
        return t

    def _rows(self, t, rows, heads, dim):
        """A torch output as a float32 [rows, heads, dim] array (unchanged shape when it does not fit,
        so that the C++ side reports the shape)."""
        t = t.detach().to(device="cpu", dtype=_torch().float32)
        if t.numel() == rows * heads * dim:
            t = t.reshape(rows, heads, dim)
        return np.ascontiguousarray(t.numpy())

    def _lse_rows(self, lse, rows):
        torch = _torch()
        lse = lse.detach().to(device="cpu", dtype=torch.float32)
        expected = (self.heads_q, rows) if self.varlen else (self.batch, self.heads_q, self.seqlen_q)
        if tuple(lse.shape) != expected:
            return np.ascontiguousarray(lse.numpy())  # reported as the wrong shape
        lse = lse.transpose(0, 1) if self.varlen else lse.permute(0, 2, 1)
        return np.ascontiguousarray(lse.reshape(rows, self.heads_q, 1).numpy())


@dataclass
class Result:
    """What check() found: one C++ case result per problem (status, errors, report)."""
    cases: list = field(default_factory=list)
    backward: bool = False

    @property
    def passed(self):
        return sum(c.status == "passed" for c in self.cases)

    @property
    def failed(self):
        return sum(c.status == "failed" for c in self.cases)

    @property
    def refused(self):
        return sum(c.status == "refused" for c in self.cases)

    @property
    def ok(self):
        """No case failed (refused ones are listed in the summary)."""
        return self.failed == 0

    def summary(self):
        """The C++ library's summary: the report of every case that did not pass, then the counts."""
        return (_rule.backward_summary if self.backward else _rule.forward_summary)(self.cases)

    def __str__(self):
        return self.summary()


def check(fn, grid=None, *, dtype="bf16", device=None, backward=False, check_lse=True, check_determinism=True,
          key_growth=0.0, input_scale=1.0):
    """Checks fn(q, k, v, case) -> out or (out, lse) on every problem of `grid` (default:
    default_grid(dtype)) with the C++ library's rule; returns a Result. device: where the inputs go
    (default: CUDA when available, else the CPU). backward=True checks dQ, dK, dV from
    torch.autograd on fn's out (3x rule) instead of the forward. check_lse=False: fn gives no LSE
    (O alone is checked). key_growth and input_scale: the C++ options of the same names (scores
    that keep growing along the keys; Q and K scaled for scores in the thousands)."""
    torch = _torch()
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    grid = default_grid(dtype) if grid is None else list(grid)
    result = Result(backward=backward)
    for problem in grid:
        if backward:
            result.cases.append(_rule.check_backward_case(_backward_bridge(fn, device), problem,
                                                          input_scale=input_scale))
        else:
            result.cases.append(_rule.check_forward_case(_forward_bridge(fn, device, check_lse), problem,
                                                         check_determinism=check_determinism, key_growth=key_growth,
                                                         input_scale=input_scale, check_lse=check_lse))
    return result


def _forward_bridge(fn, device, check_lse):
    def run(problem, q, k, v):
        case = Case(problem, device)
        torch = _torch()
        with torch.no_grad():
            out = fn(case._to_torch(q, case.heads_q, True), case._to_torch(k, case.heads_kv, False),
                     case._to_torch(v, case.heads_kv, False), case)
        lse = None
        if isinstance(out, (tuple, list)):
            out, lse = out[0], (out[1] if len(out) > 1 and check_lse else None)
        rows = q.shape[0]
        return (case._rows(out, rows, case.heads_q, case.head_dim),
                None if lse is None else case._lse_rows(lse, rows))
    return run


def _backward_bridge(fn, device):
    def run(problem, q, k, v, o, lse, d_o):
        torch = _torch()
        case = Case(problem, device)
        inputs = [case._to_torch(q, case.heads_q, True), case._to_torch(k, case.heads_kv, False),
                  case._to_torch(v, case.heads_kv, False)]
        for t in inputs:
            t.requires_grad_(True)
        out = fn(*inputs, case)
        if isinstance(out, (tuple, list)):
            out = out[0]
        grads = torch.autograd.grad(out, inputs, case._to_torch(d_o, case.heads_q, True))
        return tuple(case._rows(g, a.shape[0], a.shape[1], a.shape[2]) for g, a in zip(grads, (q, k, v)))
    return run


# ---------------------------------------------------------------------------------------------
# Ready-made implementations.

def flashlab_ops(generation="auto", deterministic=False):
    """flashlab.ops' flash_attn_func / flash_attn_varlen_func with `generation`, LSE included."""
    def run(q, k, v, case):
        from flashlab import ops  # noqa: PLC0415 - torch's module, imported on use
        function = ops.flash_attn_varlen_func if case.varlen else ops.flash_attn_func
        return function(q, k, v, **case.flash_kwargs(), deterministic=deterministic, return_lse=True,
                        generation=generation)
    run.__name__ = f"flashlab_ops_{generation}"
    return run


def sdpa(q, k, v, case):
    """PyTorch's scaled_dot_product_attention, one sequence at a time with the case's mask as a
    boolean attn_mask and K, V repeated for GQA/MQA; no LSE (check it with check_lse=False). A row
    that sees no key is whatever SDPA makes of an all-False mask row."""
    import torch.nn.functional as F  # noqa: PLC0415
    torch = _torch()
    group = case.heads_q // case.heads_kv
    outputs = []
    for b, (qs, ks, vs) in enumerate(case.sequences(q, k, v)):
        out = F.scaled_dot_product_attention(qs.transpose(0, 1), ks.transpose(0, 1).repeat_interleave(group, 0),
                                             vs.transpose(0, 1).repeat_interleave(group, 0),
                                             attn_mask=case.visible_keys(b), scale=case.softmax_scale)
        outputs.append(out.transpose(0, 1))
    return torch.cat(outputs) if case.varlen else torch.stack(outputs)
