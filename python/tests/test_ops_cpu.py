"""flashlab.ops without a GPU: importing without torch, the refusals, the reference generation
against the C++ rule, gradcheck in fp64, the fake implementations (opcheck) and torch.compile."""
import pytest

from flashlab import _abi


torch = pytest.importorskip("torch")
from flashlab import ops, testing  # noqa: E402


def inputs(batch=2, seqlen_q=13, seqlen_k=21, heads_q=4, heads_kv=2, head_dim=16, dtype=torch.float64,
           requires_grad=False):
    generator = torch.Generator().manual_seed(7)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, dtype=dtype, generator=generator)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, generator=generator)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, generator=generator)
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


@pytest.mark.parametrize("arguments, message", [
    (dict(dropout_p=0.1), r"dropout_p = 0.1; allowed: 0.0 \(FlashLab's kernels have no dropout\)"),
    (dict(generation="fa4"), r"generation = 'fa4'; allowed: 'auto', 'fa1', 'fa2', 'fa3', 'reference'"),
    (dict(generation="auto"), r"q is on cpu: generation 'auto' runs a CUDA kernel; allowed: tensors on a CUDA "
                              r"device, or generation='reference'"),
    (dict(generation="fa2"), r"q is on cpu: generation 'fa2'"),
    (dict(softmax_scale=-1.0), r"softmax_scale = -1.0; allowed: None \(1/sqrt\(head_dim\)\) or a positive number"),
    (dict(window_size=(-2, 0)), r"window_size = \(-2, 0\); allowed: \(left, right\), each -1 \(unbounded\) or >= 0"),
    (dict(window_size=4), r"window_size = 4; allowed"),
])
def test_bad_arguments_are_refused_by_name(arguments, message):
    q, k, v = inputs()
    arguments.setdefault("generation", "reference")
    with pytest.raises(ValueError, match=message):
        ops.flash_attn_func(q, k, v, **arguments)


def test_bad_tensors_are_refused_by_name():
    q, k, v = inputs()
    with pytest.raises(ValueError, match=r"k.dtype = torch.float32, q.dtype = torch.float64; allowed: the same"):
        ops.flash_attn_func(q, k.float(), v, generation="reference")
    with pytest.raises(ValueError, match=r"v.shape = \(2, 20, 2, 16\), k.shape = \(2, 21, 2, 16\); allowed: equal"):
        ops.flash_attn_func(q, k, v[:, :20], generation="reference")
    with pytest.raises(ValueError, match=r"q has shape \(26, 4, 16\); allowed: 4 dimensions"):
        ops.flash_attn_func(q.flatten(0, 1), k, v, generation="reference")
    with pytest.raises(ValueError, match="heads_q = 4 is not a multiple of heads_kv = 3"):
        ops.flash_attn_func(q, *inputs(heads_kv=3)[1:], generation="reference")
    with pytest.raises(ValueError, match=r"k's head_dim = 8, q's = 16"):
        ops.flash_attn_func(q, k[..., :8], v[..., :8], generation="reference")
    with pytest.raises(ValueError, match=r"k.shape\[0\] = 1 \(batch\) differs from q.shape\[0\] = 2"):
        ops.flash_attn_func(q, k[:1], v[:1], generation="reference")
    with pytest.raises(ValueError, match="q is a list; allowed: a torch.Tensor"):
        ops.flash_attn_func([1.0], k, v)
    offsets = torch.tensor([0, 13, 26], dtype=torch.int64)
    with pytest.raises(ValueError, match=r"cu_seqlens_q: torch.int64, shape \(3,\); allowed: a 1-D torch.int32"):
        ops.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), offsets, offsets.int(), 13, 21,
                                   generation="reference")
    with pytest.raises(ValueError, match=r"max_seqlen_k = 0; allowed: an int >= 1"):
        ops.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), offsets.int(), offsets.int(),
                                   13, 0, generation="reference")


def test_without_the_kernel_library_an_op_says_so(monkeypatch):
    monkeypatch.delenv(_abi.LIBRARY_ENVIRONMENT_VARIABLE, raising=False)
    monkeypatch.setattr(_abi, "PACKAGED_LIBRARY", _abi.PACKAGED_LIBRARY.parent / "absent" / _abi.LIBRARY_NAME)
    monkeypatch.setattr(_abi, "_library", None)
    assert not ops.kernels_available()
    with pytest.raises(ops.KernelsUnavailable, match="built without the CUDA kernels"):
        ops.resolve_generation("auto", "cuda:0")
    # The reference needs no library.
    q, k, v = inputs()
    assert ops.flash_attn_func(q, k, v, generation="reference").shape == q.shape


def sdpa_reference(q, k, v, mask, scale):
    group = q.shape[2] // k.shape[2]
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(group, 1), v.transpose(1, 2).repeat_interleave(group, 1),
        attn_mask=mask, scale=scale).transpose(1, 2)


def test_the_backward_follows_the_forward_generation_where_it_can():
    # The Hopper rung's backward after its forward up to head dim 128, FA2's backward otherwise
    # (above 128, and after the fa1 and fa2 forwards).
    assert [ops.backward_generation(3, d) for d in (8, 64, 96, 128, 136, 256, 264)] == [3, 3, 3, 3, 3, 3, 2]
    assert ops.backward_generation(2, 64) == 2 and ops.backward_generation(1, 64) == 2


def test_reference_generation_matches_sdpa_with_the_bottom_right_mask():
    q, k, v = inputs()
    out, lse = ops.flash_attn_func(q, k, v, causal=True, window_size=(5, -1), return_lse=True,
                                   generation="reference")
    rows, cols = torch.arange(13)[:, None] + (21 - 13), torch.arange(21)[None, :]
    mask = (cols <= rows) & (cols >= rows - 5)
    assert torch.allclose(out, sdpa_reference(q, k, v, mask, 16 ** -0.5), atol=1e-12)
    assert lse.shape == (2, 4, 13) and lse.dtype == torch.float64
    assert not lse.requires_grad


def test_reference_generation_passes_the_cpp_rule():
    # The reference is the CPU stand-in of the kernels and what gradcheck goes through: held to
    # the oracle by the C++ rule (forward and gradients) on the small shapes of the default grid.
    grid = [p for p in testing.default_grid("bf16", (40, 64)) if p.seqlen_q * p.seqlen_k <= 256 * 256]
    forward = testing.check(testing.flashlab_ops("reference"), grid, device="cpu")
    assert forward.failed == 0, forward.summary()
    assert forward.passed > 0
    # Refused: the top-left alignments flash-attention's interface cannot say.
    assert all("top-left" in c.report for c in forward.cases if c.status == "refused"), forward.summary()
    backward = testing.check(testing.flashlab_ops("reference"), grid[:9], device="cpu", backward=True)
    assert backward.failed == 0 and backward.passed > 0, backward.summary()


def test_the_rule_catches_a_planted_mask_bug_through_torch():
    def off_by_one(q, k, v, case):
        kwargs = case.flash_kwargs()
        if kwargs["causal"]:
            kwargs["causal"], kwargs["window_size"] = False, (-1, 1)  # one key past the diagonal
        return ops.flash_attn_func(q, k, v, **kwargs, return_lse=True, generation="reference")
    grid = [p for p in testing.default_grid("bf16", (40,)) if p.causal and p.alignment == "bottom_right"
            and p.seqlen_q * p.seqlen_k <= 256 * 256 and p.seqlen_k > 1 and not p.varlen()]
    result = testing.check(off_by_one, grid, device="cpu")
    assert result.cases and all(c.status == "failed" for c in result.cases), result.summary()


@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (False, (2, 1)), (True, (2, -1))])
def test_gradcheck_in_fp64_through_the_reference(causal, window):
    # Small (176 inputs, two finite differences each): GQA 2/1, seqlen_q < seqlen_k.
    q, k, v = inputs(seqlen_q=5, seqlen_k=6, heads_q=2, heads_kv=1, head_dim=4, requires_grad=True)

    def attention(q, k, v):
        return ops.flash_attn_func(q, k, v, causal=causal, window_size=window, softmax_scale=0.4,
                                   generation="reference")
    assert torch.autograd.gradcheck(attention, (q, k, v))


def test_gradcheck_varlen_with_a_fully_masked_sequence():
    q, k, v = (t.flatten(0, 1).detach().requires_grad_()
               for t in inputs(batch=1, seqlen_q=9, seqlen_k=11, heads_q=2, heads_kv=1, head_dim=4))
    cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 1, 11], dtype=torch.int32)

    def attention(q, k, v):  # sequence 0: 4 queries, 1 key, causal bottom-right: queries 0-2 see none
        return ops.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 10, causal=True, generation="reference")
    assert torch.autograd.gradcheck(attention, (q, k, v))
    out, lse = ops.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 10, causal=True, return_lse=True,
                                          generation="reference")
    assert lse.shape == (2, 9)
    assert torch.isneginf(lse[:, :3]).all() and (out[:3] == 0).all()


def test_opcheck_schema_fake_and_autograd_registration():
    for dtype, generation in ((torch.float32, 0), (torch.float64, 0)):
        q, k, v = inputs(dtype=dtype, requires_grad=True)
        torch.library.opcheck(ops.attention_forward, (q, k, v, None, None, 13, 21, 0.25, True, -1, -1, False,
                                                      generation))
        cu_q, cu_k = torch.tensor([0, 5, 26], dtype=torch.int32), torch.tensor([0, 20, 42], dtype=torch.int32)
        varlen = [t.flatten(0, 1).detach().requires_grad_() for t in (q, k, v)]
        torch.library.opcheck(ops.attention_forward, (*varlen, cu_q, cu_k, 21, 22, 0.25, False, 3, 3, False,
                                                      generation))


def test_fake_implementations_give_the_kernels_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(2, 13, 4, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(2, 21, 2, 64, dtype=torch.bfloat16, device="cuda")
        out, lse = ops.attention_forward(q, k, k, None, None, 13, 21, 0.125, True, -1, -1, False, 2)
        assert out.shape == q.shape and out.dtype == torch.bfloat16 and out.device.type == "cuda"
        assert lse.shape == (2, 4, 13) and lse.dtype == torch.float32
        dq, dk, dv = ops.attention_backward(out, q, k, k, out, lse, None, None, 13, 21, 0.125, True, -1, -1, False, 2)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)
        packed = torch.empty(30, 4, 64, dtype=torch.float16, device="cuda")
        offsets = torch.empty(3, dtype=torch.int32, device="cuda")
        _, varlen_lse = ops.attention_forward(packed, packed[:, :2], packed[:, :2], offsets, offsets, 20, 20, 0.125,
                                              False, -1, -1, False, 3)
        assert varlen_lse.shape == (4, 30)


class TinyAttentionModel(torch.nn.Module):
    def __init__(self, generation, dim=32, heads=4):
        super().__init__()
        self.generation, self.heads = generation, heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        batch, seqlen, dim = x.shape
        q, k, v = self.qkv(x).view(batch, seqlen, 3, self.heads, dim // self.heads).unbind(2)
        attended = ops.flash_attn_func(q, k, v, causal=True, generation=self.generation)
        return self.out(attended.reshape(batch, seqlen, dim))


def test_torch_compile_traces_the_op_without_a_graph_break():
    torch.manual_seed(0)
    model = TinyAttentionModel("reference").double()
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    eager_out, compiled_out = model(x), compiled(x)
    assert torch.allclose(eager_out, compiled_out, atol=1e-12)
    eager_grads = torch.autograd.grad(eager_out.sum(), list(model.parameters()))
    compiled_grads = torch.autograd.grad(compiled_out.sum(), list(model.parameters()))
    for eager, traced in zip(eager_grads, compiled_grads):
        assert torch.allclose(eager, traced, atol=1e-12)


def test_torch_compile_takes_the_generation_as_a_constant(tmp_path, monkeypatch):
    # Resolving a generation loads the kernel library (ctypes) and asks the device: Dynamo must
    # not trace that (fullgraph would fail), only use its answer. A stub library stands in here.
    from test_abi import COMPILER, stub_library
    if COMPILER is None:
        pytest.skip("no C compiler for the stub library")
    monkeypatch.setenv(_abi.LIBRARY_ENVIRONMENT_VARIABLE, str(stub_library(tmp_path)))
    monkeypatch.setattr(_abi, "_library", None)
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, backend="eager")
    def add_one_for_fa2(x):
        return x + (1 if ops.resolve_generation("fa2", "cuda:0") == "fa2" else 0)
    assert add_one_for_fa2(torch.zeros(1)).item() == 1
