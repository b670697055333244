"""Attention in plain PyTorch on any device and floating dtype: what flashlab.ops computes for
generation="reference" (fp64 for torch.autograd.gradcheck, CPU tensors for tests without a GPU).

It is materialised attention one sequence at a time, with the mask rule of
algorithms/mask_rule.hpp in flash-attention's bottom-right alignment, and a backward written as
FA2's Algorithm 2 writes it: P recomputed from the saved LSE, D = rowsum(dO o O), dS = P o (dP - D).
So gradcheck through it checks the same saved tensors and the same formulas as the FA2 kernel's
backward. Half-precision inputs are computed in fp32 and rounded to their dtype once at the end.
"""
import torch


def _compute_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def lse_dtype(dtype):
    """The LSE's dtype for inputs of `dtype`: fp32, or fp64 for fp64 inputs."""
    return _compute_dtype(dtype)


def visible_keys(seqlen_q, seqlen_k, causal, window_left, window_right, device):
    """[seqlen_q, seqlen_k] bool: query i sees key j iff i + offset - left <= j <= i + offset + right
    (offset = seqlen_k - seqlen_q, a bound of -1 absent, causal folding min(right, 0) in)."""
    right = window_right
    if causal:
        right = 0 if window_right < 0 else min(window_right, 0)
    rows = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    cols = torch.arange(seqlen_k, device=device)[None, :]
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right >= 0:
        visible &= cols <= rows + right
    if window_left >= 0:
        visible &= cols >= rows - window_left
    return visible


def _sequences(q, k, cu_seqlens_q, cu_seqlens_k):
    """(slice of q rows, slice of k rows) per sequence, for [rows, heads, dim] views of q and k."""
    if cu_seqlens_q is None:
        return [((b, slice(None)), (b, slice(None))) for b in range(q.shape[0])]
    offsets_q, offsets_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    return [((slice(offsets_q[b], offsets_q[b + 1]),), (slice(offsets_k[b], offsets_k[b + 1]),))
            for b in range(len(offsets_q) - 1)]


def _scores(q_rows, k_rows, scale, mask):
    """[heads_q, rows_q, rows_k] scaled scores with hidden keys at -inf (K's heads repeated for GQA)."""
    group = q_rows.shape[1] // k_rows.shape[1]
    keys = k_rows.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q_rows, keys) * scale
    return scores.masked_fill(~mask, float("-inf"))


def _probabilities(scores, lse):
    """P = exp(S - LSE), 0 where a key is hidden or a row sees none (LSE = -inf)."""
    finite = torch.isfinite(lse)[..., None]
    return torch.where(finite, torch.exp(scores - torch.where(finite, lse[..., None], 0)), 0)


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right):
    """(out like q, lse): lse [batch, heads_q, seqlen_q], or [heads_q, total_q] for varlen."""
    compute = _compute_dtype(q.dtype)
    qc, kc, vc = (t.to(compute) for t in (q, k, v))
    out = torch.empty(q.shape, dtype=compute, device=q.device)
    varlen = cu_seqlens_q is not None
    lse = torch.empty((q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1]),
                      dtype=compute, device=q.device)
    for q_index, k_index in _sequences(q, k, cu_seqlens_q, cu_seqlens_k):
        q_rows, k_rows, v_rows = qc[q_index], kc[k_index], vc[k_index]
        mask = visible_keys(q_rows.shape[0], k_rows.shape[0], causal, window_left, window_right, q.device)
        scores = _scores(q_rows, k_rows, softmax_scale, mask)
        row_lse = torch.logsumexp(scores, dim=-1)  # -inf where a row sees no key
        group = q_rows.shape[1] // k_rows.shape[1]
        out[q_index] = torch.einsum("hqk,khd->qhd", _probabilities(scores, row_lse),
                                    v_rows.repeat_interleave(group, dim=1))
        if varlen:
            lse[:, q_index[0]] = row_lse
        else:
            lse[q_index[0]] = row_lse
    return out.to(q.dtype), lse


def backward(d_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left,
             window_right):
    """(dq, dk, dv) from the saved out and lse (FA2 Algorithm 2's inputs)."""
    compute = _compute_dtype(q.dtype)
    qc, kc, vc, oc, doc = (t.to(compute) for t in (q, k, v, out, d_out))
    lsec = lse.to(compute)
    dq = torch.zeros(q.shape, dtype=compute, device=q.device)
    dk = torch.zeros(k.shape, dtype=compute, device=q.device)
    dv = torch.zeros(v.shape, dtype=compute, device=q.device)
    varlen = cu_seqlens_q is not None
    for q_index, k_index in _sequences(q, k, cu_seqlens_q, cu_seqlens_k):
        q_rows, k_rows, v_rows = qc[q_index], kc[k_index], vc[k_index]
        heads_kv = k_rows.shape[1]
        group = q_rows.shape[1] // heads_kv
        mask = visible_keys(q_rows.shape[0], k_rows.shape[0], causal, window_left, window_right, q.device)
        row_lse = lsec[:, q_index[0]] if varlen else lsec[q_index[0]]
        p = _probabilities(_scores(q_rows, k_rows, softmax_scale, mask), row_lse)  # [h, q, k]
        d_o, o = doc[q_index], oc[q_index]
        dv_heads = torch.einsum("hqk,qhd->khd", p, d_o)
        dp = torch.einsum("qhd,khd->hqk", d_o, v_rows.repeat_interleave(group, dim=1))
        delta = (d_o * o).sum(-1).transpose(0, 1)  # D = rowsum(dO o O), [h, q]
        ds = p * (dp - delta[..., None])
        dq[q_index] = torch.einsum("hqk,khd->qhd", ds, k_rows.repeat_interleave(group, dim=1)) * softmax_scale
        dk_heads = torch.einsum("hqk,qhd->khd", ds, q_rows) * softmax_scale
        # A KV head's gradient sums over the query heads of its group.
        dk[k_index] = dk_heads.reshape(dk_heads.shape[0], heads_kv, group, -1).sum(2)
        dv[k_index] = dv_heads.reshape(dv_heads.shape[0], heads_kv, group, -1).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def materialized_attention(q, k, v, causal, dtype):
    """Attention over [batch, seqlen, heads, dim] tensors computed in `dtype`, S and P materialised
    and differentiated by autograd, the causal mask top-left aligned (equal lengths): in fp32 the
    reference, in bf16 the baseline of the 2x / 3x rule (attention as a framework computes it).
    The softmax itself runs in fp32 and P is rounded to `dtype`."""
    group = q.shape[2] // k.shape[2]
    q, k, v = (t.to(dtype) for t in (q, k, v))
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    if causal:
        n = q.shape[1]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores.float(), dim=-1).to(dtype), v)
