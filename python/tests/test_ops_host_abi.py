"""flashlab.ops' kernel path without a GPU: the package's own declarations and call sequence run
against a host-memory implementation of the C ABI (host_abi_stub.c, reading tensors only through
the pointers and strides it is given), so the tensors, strides, LSE layout, varlen offsets and the
backward's arguments flashlab.ops hands the ABI are checked against the reference generation. Only
the CUDA device guard and the stream are stood in for."""
import pathlib
import subprocess

import pytest

torch = pytest.importorskip("torch")
from flashlab import _abi, ops  # noqa: E402
from test_abi import COMPILER, HEADER  # noqa: E402

pytestmark = pytest.mark.skipif(COMPILER is None or not HEADER.exists(), reason="needs a C compiler and flashlab.h")


@pytest.fixture
def host_kernels(tmp_path, monkeypatch):
    library = tmp_path / "libhost_abi.so"
    source = pathlib.Path(__file__).with_name("host_abi_stub.c")
    subprocess.run([COMPILER, "-std=c11", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", f"-I{HEADER.parent}",
                    "-o", str(library), str(source), "-lm"], check=True)
    monkeypatch.setenv(_abi.LIBRARY_ENVIRONMENT_VARIABLE, str(library))
    monkeypatch.setattr(_abi, "_library", None)
    # The kernel generations on CPU tensors, as if on a device; the reference stays the reference.
    monkeypatch.setattr(ops, "_resolve_generation",
                        lambda generation, device: "reference" if generation == "reference" else "fa2")

    def enter(call):
        call.stream = 0
        return call
    monkeypatch.setattr(ops._KernelCall, "__enter__", enter)
    monkeypatch.setattr(ops._KernelCall, "__exit__", lambda call, *exc: None)


def close(got, expected, tolerance):
    assert got.shape == expected.shape
    finite = torch.isfinite(expected)
    assert torch.equal(torch.isfinite(got), finite)
    assert (got.float()[finite] - expected.float()[finite]).abs().max().item() <= tolerance


def qkv(shape_q, shape_kv, seed=3):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=generator).to(torch.bfloat16) for s in (shape_q, shape_kv, shape_kv)]


def test_dense_strided_gqa_forward_and_backward(host_kernels):
    # q, k, v as views into one buffer [batch, seqlen, 3, heads, dim] (strided rows), GQA 4/2
    # through k and v's first two heads: none of them contiguous.
    packed = torch.randn(2, 23, 3, 4, 16, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    q, k, v = packed[:, :19, 0], packed[:, :, 1, :2], packed[:, :, 2, :2]
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    d_out = torch.randn(2, 19, 4, 16, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    for causal, window in ((False, (-1, -1)), (True, (-1, -1)), (False, (3, 2)), (True, (6, -1))):
        kwargs = dict(causal=causal, window_size=window, softmax_scale=0.3, return_lse=True)
        out, lse = ops.flash_attn_func(q, k, v, generation="fa2", **kwargs)
        ref_out, ref_lse = ops.flash_attn_func(q, k, v, generation="reference", **kwargs)
        close(out, ref_out, 2e-2)
        close(lse, ref_lse, 1e-4)
        grads = torch.autograd.grad(out, (q, k, v), d_out)
        ref_grads = torch.autograd.grad(ref_out, (q, k, v), d_out)
        for got, expected in zip(grads, ref_grads):
            close(got, expected, 3e-2 * expected.float().abs().max().item())


def test_varlen_with_a_sequence_that_sees_no_key(host_kernels):
    # Sequences of 5/1, 9/12 and 3/3 queries/keys; causal bottom-right: queries 0-3 of the first see
    # nothing (LSE -inf, O = 0).
    cu_q = torch.tensor([0, 5, 14, 17], dtype=torch.int32)
    cu_k = torch.tensor([0, 1, 13, 16], dtype=torch.int32)
    q, k, v = (t.requires_grad_() for t in qkv((17, 4, 16), (16, 1, 16)))  # MQA
    d_out = qkv((17, 4, 16), (1, 1, 1), seed=9)[0]
    kwargs = dict(causal=True, return_lse=True)
    out, lse = ops.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 12, generation="fa2", **kwargs)
    ref_out, ref_lse = ops.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 12, generation="reference", **kwargs)
    assert lse.shape == (4, 17) and torch.isneginf(lse[:, :4]).all() and (out[:4] == 0).all()
    close(out, ref_out, 2e-2)
    close(lse, ref_lse, 1e-4)
    grads = torch.autograd.grad(out, (q, k, v), d_out)
    ref_grads = torch.autograd.grad(ref_out, (q, k, v), d_out)
    for got, expected in zip(grads, ref_grads):
        close(got, expected, 3e-2 * expected.float().abs().max().item())


def test_offsets_past_the_tensors_are_refused_before_the_call(host_kernels):
    q, k, v = qkv((10, 2, 16), (10, 2, 16))
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[-1\] = 12 exceeds the 10 rows of k and v"):
        ops.flash_attn_varlen_func(q, k, v, torch.tensor([0, 4, 10], dtype=torch.int32),
                                   torch.tensor([0, 6, 12], dtype=torch.int32), 6, 6, generation="fa2")


def test_a_refusal_of_the_library_raises_its_message(host_kernels):
    q, k, v = (t.half() for t in qkv((1, 8, 2, 16), (1, 8, 2, 16)))
    with pytest.raises(ops.KernelRefused, match=r"^host stub: dtype, head_dim; allowed: 2 \(bf16\), at most 512$"):
        ops.flash_attn_func(q, k, v, generation="fa2")


def test_heads_that_are_not_contiguous_are_copied_for_the_abi(host_kernels):
    # The ABI's strides stop at the head: a head whose elements are strided (a transposed view)
    # reaches it as a contiguous copy, from flash_attn_func and from the op itself.
    q, k, v = qkv((1, 9, 2, 16), (1, 11, 2, 16))
    q_strided = q.transpose(1, 3).contiguous().transpose(1, 3)  # same values, head dim stride 18
    assert q_strided.stride(-1) != 1
    expected = ops.flash_attn_func(q, k, v, generation="fa2")
    assert torch.equal(ops.flash_attn_func(q_strided, k, v, generation="fa2"), expected)
    out, _ = ops.attention_forward(q_strided, k, v, None, None, 9, 11, 0.25, False, -1, -1, False, 2)
    assert torch.equal(out, expected)


def test_decode_against_a_paged_and_a_contiguous_cache(host_kernels, monkeypatch):
    # flash_attn_with_kvcache's arguments as the ABI gets them: the cache's (page, slot, head)
    # strides, the block table, the new tokens, the LSE's layout; on the host stub's decode.
    monkeypatch.setattr(ops, "_on_device", lambda device, launch: launch(0))
    generator = torch.Generator().manual_seed(5)
    batch, tokens, heads_q, heads_kv, d, page = 2, 3, 4, 2, 16, 16
    lengths, appended = [20, 7], 2
    q = torch.randn(batch, tokens, heads_q, d, generator=generator).to(torch.bfloat16)
    keys = torch.randn(batch, 48, heads_kv, d, generator=generator).to(torch.bfloat16)
    values = torch.randn(batch, 48, heads_kv, d, generator=generator).to(torch.bfloat16)
    new_k = torch.randn(batch, appended, heads_kv, d, generator=generator).to(torch.bfloat16)
    new_v = torch.randn(batch, appended, heads_kv, d, generator=generator).to(torch.bfloat16)
    table = torch.tensor([[5, 0, 3], [1, 4, 2]], dtype=torch.int32)
    k_pages = torch.zeros(6, page, heads_kv, d, dtype=torch.bfloat16)
    v_pages = torch.zeros_like(k_pages)
    for b in range(batch):
        for p in range(3):
            k_pages[table[b, p]] = keys[b, p * page:(p + 1) * page]
            v_pages[table[b, p]] = values[b, p * page:(p + 1) * page]
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    for causal in (False, True):
        expected = []
        for b, length in enumerate(lengths):
            k_all = torch.cat([keys[b, :length], new_k[b]]).double().repeat_interleave(heads_q // heads_kv, 1)
            v_all = torch.cat([values[b, :length], new_v[b]]).double().repeat_interleave(heads_q // heads_kv, 1)
            scores = torch.einsum("thc,khc->htk", q[b].double(), k_all) * d ** -0.5
            if causal:
                total = length + appended
                hidden = torch.arange(total)[None, :] > torch.arange(tokens)[:, None] + total - tokens
                scores = scores.masked_fill(hidden, float("-inf"))
            expected.append(torch.einsum("htk,khc->thc", torch.softmax(scores, -1), v_all))
        expected = torch.stack(expected)
        for cache in ("contiguous", "paged"):
            k_cache, v_cache = (keys.clone(), values.clone()) if cache == "contiguous" else (k_pages.clone(), v_pages.clone())
            out, lse = ops.flash_attn_with_kvcache(q, k_cache, v_cache, k=new_k, v=new_v, cache_seqlens=seqlens,
                                                   block_table=None if cache == "contiguous" else table, causal=causal,
                                                   return_softmax_lse=True)
            close(out, expected, 2e-2)
            assert lse.shape == (batch, heads_q, tokens)
            for b, length in enumerate(lengths):
                for j in range(appended):
                    key = length + j
                    where = (b, key) if cache == "contiguous" else (table[b, key // page], key % page)
                    assert torch.equal(k_cache[where], new_k[b, j]) and torch.equal(v_cache[where], new_v[b, j])


def test_decode_refuses_what_it_does_not_do(host_kernels):
    q = torch.zeros(1, 1, 4, 16, dtype=torch.bfloat16)
    cache = torch.zeros(1, 8, 2, 16, dtype=torch.bfloat16)
    for kwargs, name in ((dict(rotary_cos=q), "rotary_cos"), (dict(alibi_slopes=q), "alibi_slopes"),
                         (dict(window_size=(4, 0)), "window_size"), (dict(softcap=1.0), "softcap"),
                         (dict(cache_seqlens=None), "cache_seqlens"), (dict(k=cache), "k and v")):
        arguments = dict(cache_seqlens=3) | kwargs
        with pytest.raises(ValueError, match=name):
            ops.flash_attn_with_kvcache(q, cache, cache, **arguments)
