"""PyTorch SDPA backward timings on the shapes of test_fa2_backward_bench (bf16, 16k tokens per batch,
heads = 2048 / head_dim), in the flash-attention FLOP convention (backward = 2.5 x 4 b h s^2 d,
halved when causal). Medians of CUDA-event timings of out.backward(dO). Usage:
  python3 test_fa2_backward_sdpa.py [flash|cudnn|efficient ...]
"""
import math
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def time_backward(backend, head_dim, causal, seqlen, total_tokens=16384, repeats=15):
    batch, heads = max(1, total_tokens // seqlen), 2048 // head_dim
    shape = (batch, heads, seqlen, head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    d_o = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(BACKENDS[backend]):
        out = scaled_dot_product_attention(q, k, v, is_causal=causal)
        times = []
        for i in range(repeats + 3):
            q.grad = k.grad = v.grad = None
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out.backward(d_o, retain_graph=True)
            stop.record()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(start.elapsed_time(stop))
    ms = sorted(times)[len(times) // 2]
    flops = 2.5 * 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    return batch, heads, ms, flops / ms / 1e9


if __name__ == "__main__":
    backends = sys.argv[1:] or ["flash"]
    print(f"{'backend':9} {'hdim':5} {'causal':6} {'seqlen':6} {'batch':5} {'h':3} {'ms':>10} {'TFLOP/s':>9}")
    for backend in backends:
        for head_dim in (64, 128):
            for causal in (0, 1):
                for seqlen in (512, 1024, 2048, 4096, 8192, 16384):
                    batch, heads, ms, tflops = time_backward(backend, head_dim, bool(causal), seqlen)
                    print(f"{backend:9} {head_dim:<5} {causal:<6} {seqlen:<6} {batch:<5} {heads:<3} {ms:10.3f} {tflops:9.1f}",
                          flush=True)
