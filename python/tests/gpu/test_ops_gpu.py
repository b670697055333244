"""flashlab.ops on a GPU: the kernels against the oracle by the C++ rule on the default grid
(forward 2x, gradients 3x), against SDPA, under torch.compile, on torch's current stream, and
the kernels' own refusals."""
import pytest

torch = pytest.importorskip("torch")
from flashlab import _abi, ops, testing  # noqa: E402

pytestmark = pytest.mark.gpu

KERNEL_DTYPES = ("bf16", "fp16")


def generations():
    """The forward kernels this device and library run: fa2, and fa3 on compute capability 9.0
    with sm_90a code."""
    names = ["fa2"]
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and _abi.available() \
            and _abi.library().generation_built(3):
        names.append("fa3")
    return names


def refused_for_a_known_reason(case):
    """flash-attention's interface has no top-left alignment; the kernels refuse head dims that
    are not multiples of 8 (59, 111 in the grid), naming them."""
    return case.status == "refused" and ("top-left" in case.report or "head_dim = 59" in case.report
                                         or "head_dim = 111" in case.report)


def assert_grid(result, minimum_passed):
    assert result.failed == 0, result.summary()
    assert all(c.status == "passed" or refused_for_a_known_reason(c) for c in result.cases), result.summary()
    assert result.passed >= minimum_passed, result.summary()


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("generation", ["fa2", "fa3"])
def test_forward_kernels_pass_the_rule_on_the_default_grid(generation, dtype):
    if generation not in generations():
        pytest.skip(f"{generation} does not run here")
    result = testing.check(testing.flashlab_ops(generation), testing.default_grid(dtype), device="cuda")
    print(result.summary())
    # 40 cases: 8 top-left ones with seqlen_q != seqlen_k and those at head_dim 59 or 111 refused.
    assert_grid(result, minimum_passed=22)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_backward_kernel_passes_the_3x_rule_on_the_default_grid(dtype):
    result = testing.check(testing.flashlab_ops("auto"), testing.default_grid(dtype), device="cuda", backward=True)
    print(result.summary())
    assert_grid(result, minimum_passed=22)


@pytest.mark.parametrize("generation", ["fa2", "fa3"])
def test_deterministic_backward_passes_and_repeats_bitwise(generation):
    """The deterministic backward after each forward (fa3: the Hopper backward, d 256 included)."""
    if generation not in generations():
        pytest.skip(f"{generation} does not run here")
    head_dims = (64, 128) if generation == "fa2" else (64, 128, 256)
    grid = [p for p in testing.default_grid("bf16", head_dims) if p.seqlen_q * p.seqlen_k <= 512 * 256]
    result = testing.check(testing.flashlab_ops(generation, deterministic=True), grid, device="cuda", backward=True)
    assert_grid(result, minimum_passed=10)
    for head_dim in head_dims[::2]:
        q, k, v = (torch.randn(2, 301, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for heads in (4, 2, 2))
        d_out = torch.randn(2, 301, 4, head_dim, device="cuda", dtype=torch.bfloat16)
        runs = [torch.autograd.grad(ops.flash_attn_func(q, k, v, causal=True, deterministic=True, generation=generation),
                                    (q, k, v), d_out)
                for _ in range(3)]
        for later in runs[1:]:
            assert all(torch.equal(a, b) for a, b in zip(runs[0], later)), f"{generation} d {head_dim}"


def test_fa1_forward_passes_where_it_runs():
    grid = [p for p in testing.default_grid("fp16", (40, 64, 96, 128)) if p.seqlen_q * p.seqlen_k <= 512 * 256]
    result = testing.check(testing.flashlab_ops("fa1"), grid, device="cuda")
    assert result.failed == 0, result.summary()
    assert result.passed >= 10, result.summary()


def test_auto_picks_by_compute_capability():
    expected = "fa3" if "fa3" in generations() else "fa2"
    assert ops.resolve_generation("auto", "cuda") == expected


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ops_against_sdpa_on_the_odd_shapes(dtype):
    # The official tests' comparison with SDPA as the baseline: our error against fp32 attention
    # (SDPA's math backend on fp32 copies) within 2x SDPA's own error in the same precision.
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    checked = 0
    for seqlen_q, seqlen_k in testing.odd_shapes():
        for causal in (False, True):
            if causal and seqlen_q > seqlen_k:
                continue  # fully masked rows: SDPA makes NaN of them, we make 0
            q = torch.randn(2, seqlen_q, 4, 64, device="cuda", dtype=dtype)
            k, v = (torch.randn(2, seqlen_k, 2, 64, device="cuda", dtype=dtype) for _ in range(2))
            rows = torch.arange(seqlen_q, device="cuda")[:, None] + (seqlen_k - seqlen_q)
            mask = torch.arange(seqlen_k, device="cuda")[None, :] <= rows if causal else None

            def sdpa(q, k, v):
                return torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(2, 1),
                    v.transpose(1, 2).repeat_interleave(2, 1), attn_mask=mask).transpose(1, 2)
            with sdpa_kernel(SDPBackend.MATH):
                exact = sdpa(q.float(), k.float(), v.float())
            baseline = sdpa(q, k, v)
            # The C++ rule's slack: the output format's rounding of the reference (a row with one
            # key is V exactly in SDPA and an ulp away where P is not exactly 1).
            slack = max(1e-5, testing.rounding_slack("bf16" if dtype == torch.bfloat16 else "fp16",
                                                     exact.flatten().tolist()))
            allowed = 2 * (baseline.float() - exact).abs().max().item() + slack
            for generation in generations():
                out = ops.flash_attn_func(q, k, v, causal=causal, generation=generation)
                error = (out.float() - exact).abs().max().item()
                assert error <= allowed, f"{generation} {seqlen_q}x{seqlen_k} causal={causal}: {error} > {allowed}"
                checked += 1
    assert checked == 18 * len(generations())  # 11 shapes, 7 of them causal with seqlen_q <= seqlen_k


def test_sdpa_through_the_same_library():
    # An outside implementation (PyTorch's SDPA, no LSE) checked as ours are: every case whose
    # rows all see a key passes.
    grid = [p for p in testing.default_grid("bf16", (64, 128)) if p.seqlen_q * p.seqlen_k <= 512 * 256]
    result = testing.check(testing.sdpa, grid, device="cuda", check_lse=False)
    assert all(c.status == "passed" for c in result.cases if c.fully_masked_rows == 0), result.summary()


class TinyAttentionModel(torch.nn.Module):
    def __init__(self, dim=256, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        batch, seqlen, dim = x.shape
        q, k, v = self.qkv(x).view(batch, seqlen, 3, self.heads, dim // self.heads).unbind(2)
        return self.out(ops.flash_attn_func(q, k, v, causal=True).reshape(batch, seqlen, dim))


def test_torch_compile_of_a_model_using_the_op():
    torch.manual_seed(0)
    model = TinyAttentionModel().cuda().to(torch.bfloat16)
    x = torch.randn(2, 333, 256, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(model, fullgraph=True)  # fullgraph: a graph break would raise
    eager_out, compiled_out = model(x), compiled(x)
    assert (compiled_out.float() - eager_out.float()).abs().max().item() <= 0.05
    eager_grads = torch.autograd.grad(eager_out.float().square().sum(), list(model.parameters()))
    compiled_grads = torch.autograd.grad(compiled_out.float().square().sum(), list(model.parameters()))
    for eager, traced in zip(eager_grads, compiled_grads):
        assert (eager.float() - traced.float()).abs().max().item() <= 0.05 * eager.float().abs().max().item() + 1e-3


def test_kernels_run_on_torchs_current_stream():
    # A side stream (PyTorch's are non-blocking) busy for a while, then q overwritten on it, then
    # the op on it: only a kernel launched on that stream sees the new q.
    q, k, v = (torch.randn(1, 1024, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    new_q = torch.randn_like(q)
    expected = ops.flash_attn_func(new_q, k, v, generation="fa2")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        q.copy_(new_q)
        out = ops.flash_attn_func(q, k, v, generation="fa2")
        q_grad_input = q.detach().clone().requires_grad_()
        (dq,) = torch.autograd.grad(ops.flash_attn_func(q_grad_input, k, v), (q_grad_input,), torch.ones_like(q))
    side.synchronize()
    assert torch.equal(out, expected)
    assert torch.isfinite(dq).all()


def test_strided_inputs_from_a_packed_qkv_give_the_same_result():
    qkv = torch.randn(2, 257, 3, 4, 64, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)
    assert not q.is_contiguous()
    packed = ops.flash_attn_func(q, k, v, causal=True, generation="fa2")
    dense = ops.flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=True, generation="fa2")
    assert torch.equal(packed, dense)


def test_varlen_lse_layout_matches_the_reference():
    cu = torch.tensor([0, 113, 114, 353], dtype=torch.int32, device="cuda")
    q = torch.randn(353, 4, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(353, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out, lse = ops.flash_attn_varlen_func(q, k, v, cu, cu, 239, 239, causal=True, return_lse=True)
    ref_out, ref_lse = ops.flash_attn_varlen_func(q, k, v, cu, cu, 239, 239, causal=True, return_lse=True,
                                                  generation="reference")
    assert lse.shape == ref_lse.shape == (4, 353)
    assert (lse - ref_lse).abs().max().item() < 1e-2
    assert (out.float() - ref_out.float()).abs().max().item() < 2e-2


def test_what_a_kernel_refuses_raises_with_its_own_message():
    q = torch.randn(1, 64, 2, 59, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ops.KernelRefused, match=r"fa2_forward.*head_dim = 59.*allowed"):
        ops.flash_attn_func(q, q, q, generation="fa2")
    q = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ops.KernelRefused, match=r"dtype bf16 is not supported; allowed: fp16"):
        ops.flash_attn_func(q, q, q, generation="fa1")
    with pytest.raises(ValueError, match=r"q.dtype = torch.float32; allowed: torch.float16, torch.bfloat16"):
        ops.flash_attn_func(q.float(), q.float(), q.float(), generation="fa2")
    if "fa3" not in generations():
        with pytest.raises(ops.KernelRefused):
            ops.flash_attn_func(q, q, q, generation="fa3")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="one CUDA device")
def test_tensors_on_a_second_device():
    q = torch.randn(1, 128, 2, 64, device="cuda:1", dtype=torch.bfloat16)
    out = ops.flash_attn_func(q, q, q, causal=True)
    ref = ops.flash_attn_func(q, q, q, causal=True, generation="reference")
    assert out.device == q.device and (out.float() - ref.float()).abs().max().item() < 2e-2
