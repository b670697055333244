#!/usr/bin/env python3
"""Benchmark the decode rung (flashlab.ops.flash_attn_with_kvcache's kernel) against PyTorch SDPA's
flash and cuDNN backends on the same tensors, in one run on one GPU, with the ceiling beside them:
the kernel's own loads alone (decode_stream_read: the same grid and bytes, no arithmetic).

One query token per sequence, GQA 32 query / 8 KV heads, head_dim 128, bf16 (the issue's shapes:
batch x KV length 1 x 8k, 1 x 128k, 64 x 4k, and 8 x 32k). Reported: KV bytes read per second
(K and V of every sequence once) and the ratio to the ceiling and to cuDNN. Ours runs on a
contiguous cache and on paged ones (page sizes 16, 64, 256, the pages in a random order). Every
implementation is timed as the replay of a CUDA graph of 20 calls (so launch gaps and Python
overhead stay out of all of them alike), median of triton's do_bench, in --rounds interleaved
rounds whose order rotates; the device-to-device copy bandwidth (bytes read plus written) is
measured in the same run. Correct first: ours is compared with SDPA flash's output before timing.

Usage (on the GPU machine, the kernel library built):
  python3 scripts/bench_decode.py --lib build/device/kernels/libflashlab_kernels_c.so --json d.json --markdown d.md
  python3 scripts/bench_decode.py --lib ... --profile 1 131072   # one call of ours, for Nsight Compute
"""
import argparse
import datetime
import json
import pathlib
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import interleaved_rounds
import kernel_abi

HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128
GRAPH_CALLS = 20


_abi = kernel_abi.load()


class Decode:
    """Our decode on one cache layout through the C ABI, with a workspace zeroed once (the kernel
    leaves its counters zero) and no host copies (the lengths are trusted: the benchmark made them)."""

    def __init__(self, lib, q, k_cache, v_cache, lengths, page_size=0, block_table=None, stream_only=False):
        batch = q.shape[0]
        self.lib, self.q, self.stream_only = lib, q, stream_only
        self.out = torch.empty_like(q)
        self.lse = torch.empty(batch, HEADS_Q, 1, device=q.device, dtype=torch.float32)
        self.lengths = torch.tensor(lengths, dtype=torch.int32, device=q.device)
        pointer = lambda t: (t.data_ptr(), (t.stride(0), t.stride(1), t.stride(2)))
        seqlen_k = block_table.shape[1] * page_size if block_table is not None else k_cache.shape[1]
        self.problem = _abi.make_problem(dtype="bf16", batch=batch, heads_q=HEADS_Q, heads_kv=HEADS_KV, seqlen_q=1,
                                         seqlen_k=seqlen_k, head_dim=HEAD_DIM)
        self.cache = _abi.make_kv_cache(
            k_cache=pointer(k_cache), v_cache=pointer(v_cache), cache_seqlens=self.lengths.data_ptr(),
            block_table=block_table.data_ptr() if block_table is not None else None, page_size=page_size,
            num_pages=k_cache.shape[0] if block_table is not None else 0,
            max_pages_per_sequence=block_table.shape[1] if block_table is not None else 0)
        self.keep = (k_cache, v_cache, block_table)
        self.workspace_bytes = lib.decode_workspace_bytes(self.problem, self.cache, 0)
        self.workspace = torch.zeros(max(self.workspace_bytes, 1), dtype=torch.uint8, device=q.device)
        self.pointer = pointer

    def __call__(self):
        stream = torch.cuda.current_stream().cuda_stream
        self.lib.decode(self.problem, self.cache, 0, self.pointer(self.q), self.pointer(self.out),
                        (self.lse.data_ptr(), (self.lse.stride(0), self.lse.stride(2), self.lse.stride(1))),
                        self.workspace.data_ptr(), self.workspace_bytes, self.stream_only, stream)


def graph_timer(function):
    """Milliseconds per call: a graph of GRAPH_CALLS calls, replayed under do_bench (median)."""
    function()  # outside the capture first: module load, attributes
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        function()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(GRAPH_CALLS):
                function()
    torch.cuda.current_stream().wait_stream(stream)
    return lambda: do_bench(graph.replay, warmup=50, rep=200, return_mode="median") / GRAPH_CALLS


def copy_bandwidth():
    source = torch.empty(2 ** 31, dtype=torch.uint8, device="cuda")
    destination = torch.empty_like(source)
    ms = do_bench(lambda: destination.copy_(source), warmup=50, rep=200, return_mode="median")
    return 2 * source.numel() / ms / 1e9


def paged_copy(keys, values, page_size, generator):
    """The contiguous cache [batch, length, heads, d] as pages in a random order, and its block table."""
    batch, length = keys.shape[:2]
    pages = length // page_size
    order = torch.randperm(batch * pages, generator=generator).to(torch.int32).cuda()
    table = order.view(batch, pages).contiguous()
    k_pages = torch.empty(batch * pages, page_size, HEADS_KV, HEAD_DIM, dtype=keys.dtype, device=keys.device)
    v_pages = torch.empty_like(k_pages)
    k_pages[table.flatten().long()] = keys.reshape(batch * pages, page_size, HEADS_KV, HEAD_DIM)
    v_pages[table.flatten().long()] = values.reshape(batch * pages, page_size, HEADS_KV, HEAD_DIM)
    return k_pages, v_pages, table


def run(args):
    lib = _abi.KernelLibrary(args.lib)
    generator = torch.Generator().manual_seed(0)
    result = {"environment": {"gpu": torch.cuda.get_device_name(), "pytorch": torch.__version__,
                              "cudnn": torch.backends.cudnn.version(), "cuda": torch.version.cuda,
                              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                              "command": " ".join(["python3"] + sys.argv)},
              "convention": f"KV bytes read per second (K and V once), CUDA graph of {GRAPH_CALLS} calls, median of "
                            f"do_bench, median of {args.rounds} interleaved rounds; GQA {HEADS_Q}/{HEADS_KV}, d "
                            f"{HEAD_DIM}, bf16, one query token", "rows": []}
    result["copy_tbps"] = copy_bandwidth()
    print(f"device copy: {result['copy_tbps']:.2f} TB/s (read + write)", flush=True)
    for batch, length in args.shapes:
        torch.manual_seed(batch * 1000 + length)
        q = torch.randn(batch, 1, HEADS_Q, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        keys = torch.randn(batch, length, HEADS_KV, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        values = torch.randn_like(keys)
        kv_bytes = 2 * keys.numel() * keys.element_size()
        lengths = [length] * batch
        implementations = {"flashlab": Decode(lib, q, keys, values, lengths),
                           "ceiling": Decode(lib, q, keys, values, lengths, stream_only=True)}
        for page_size in args.page_sizes:
            k_pages, v_pages, table = paged_copy(keys, values, page_size, generator)
            implementations[f"flashlab_page{page_size}"] = Decode(lib, q, k_pages, v_pages, lengths, page_size, table)
        # SDPA on [batch, heads, seqlen, d] views of the same tensors.
        q_sdpa, k_sdpa, v_sdpa = q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            expected = F.scaled_dot_product_attention(q_sdpa, k_sdpa, v_sdpa, enable_gqa=True).transpose(1, 2)
        row = {"batch": batch, "kv_length": length, "kv_bytes": kv_bytes, "max_abs_diff_vs_sdpa_flash": {}}
        for name, implementation in implementations.items():
            if name == "ceiling":
                continue
            implementation.out.fill_(float("nan"))
            implementation()
            row["max_abs_diff_vs_sdpa_flash"][name] = (implementation.out.float() - expected.float()).abs().max().item()
        timers = {name: graph_timer(implementation) for name, implementation in implementations.items()}
        for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            def call(backend=backend):
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(q_sdpa, k_sdpa, v_sdpa, enable_gqa=True)
            try:
                timers[name] = graph_timer(call)
            except RuntimeError as error:
                row.setdefault("errors", {})[name] = str(error).splitlines()[0]
        names, times = list(timers), {name: [] for name in timers}
        for round_index in range(args.rounds):
            for name in interleaved_rounds.rotated(names, round_index):
                times[name].append(timers[name]())
        row["us"] = {name: interleaved_rounds.median(t) * 1e3 for name, t in times.items()}
        row["tbps"] = {name: kv_bytes / (us * 1e-6) / 1e12 for name, us in row["us"].items()}
        result["rows"].append(row)
        print(f"batch {batch:3d} x {length:6d}: " + " ".join(f"{n}={x:.2f}" for n, x in row["tbps"].items()) + " TB/s  "
              + "diff " + " ".join(f"{n}={x:.1e}" for n, x in row["max_abs_diff_vs_sdpa_flash"].items()), flush=True)
        del implementations, timers, keys, values
    return result


def markdown(result):
    names = [n for n in ("flashlab", "flashlab_page16", "flashlab_page64", "flashlab_page256", "ceiling",
                         "sdpa_cudnn", "sdpa_flash") if any(n in r["tbps"] for r in result["rows"])]
    env = result["environment"]
    lines = [f"{env['gpu']}, PyTorch {env['pytorch']}, cuDNN {env['cudnn']}, {env['date']}; device copy "
             f"{result['copy_tbps']:.2f} TB/s. KV TB/s; ratios of ours (contiguous) to the ceiling and to cuDNN; "
             "paged over contiguous.", "",
             "| batch x KV | " + " | ".join(names) + " | ours / ceiling | ours / cuDNN | paged / contiguous |",
             "|" + " --- |" * (len(names) + 4)]
    for r in result["rows"]:
        x = r["tbps"]
        ratio = lambda a, b: "-" if not x.get(a) or not x.get(b) else f"{x[a] / x[b]:.3f}"
        paged = [x[n] / x["flashlab"] for n in x if n.startswith("flashlab_page")]
        lines.append(f"| {r['batch']} x {r['kv_length']} | " + " | ".join("-" if n not in x else f"{x[n]:.2f}" for n in names)
                     + f" | {ratio('flashlab', 'ceiling')} | {ratio('flashlab', 'sdpa_cudnn')} | "
                     + (f"{min(paged):.3f}-{max(paged):.3f}" if paged else "-") + " |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", required=True, help="libflashlab_kernels_c.so")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    parser.add_argument("--shapes", type=int, nargs="+", default=[1, 8192, 1, 131072, 64, 4096, 8, 32768],
                        help="batch and KV length pairs")
    parser.add_argument("--page-sizes", type=int, nargs="*", default=[16, 64, 256])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", type=int, nargs=2, metavar=("BATCH", "LENGTH"),
                        help="one call of ours on this shape (for Nsight Compute) and nothing else")
    args = parser.parse_args()
    if args.profile:
        batch, length = args.profile
        q = torch.randn(batch, 1, HEADS_Q, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        keys = torch.randn(batch, length, HEADS_KV, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        decode = Decode(_abi.KernelLibrary(args.lib), q, keys, torch.randn_like(keys), [length] * batch)
        decode(), decode()
        torch.cuda.synchronize()
        print(f"kv bytes {2 * keys.numel() * 2}, splits workspace {decode.workspace_bytes} bytes")
        return
    if len(args.shapes) % 2:
        parser.error("--shapes takes pairs: batch length ...")
    args.shapes = list(zip(args.shapes[::2], args.shapes[1::2]))
    result = run(args)
    table = markdown(result)
    print(table)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table)


if __name__ == "__main__":
    main()
