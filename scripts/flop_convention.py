"""The benchmarks' FLOP convention (flash-attention's), free of GPU imports: bench_kernels.py and
backward_kernel_times.py report TFLOP/s by it (and bench_kernels.py names it in its JSON);
calibrate_time_model.py and seqlen_fit.py turn those TFLOP/s back into times by it."""

TEXT = "fwd 4*b*h*s^2*d (halved when causal), bwd 2.5x fwd"


def flops(batch, heads, seqlen, head_dim, causal, backward=False):
    """A pass's FLOPs: forward 4 b h s^2 d, halved when causal; the backward 2.5 times that."""
    forward = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    return forward * (2.5 if backward else 1)
