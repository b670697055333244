#!/usr/bin/env python3
"""Ring Attention (flashlab.distributed) on GPUs: correctness, then weak scaling, printed as a table
and written as JSON with the GPU, driver, CUDA, torch, NCCL and library versions, the date and the
command.

Several GPUs of one host, one process per GPU (NCCL):
    torchrun --nproc-per-node 8 scripts/ring_bench.py --check
    torchrun --nproc-per-node 8 scripts/ring_bench.py --seqlens-per-gpu 8192,16384,32768,65536,131072 \\
        --json ring_h200x8.json --markdown ring_h200x8.md
One GPU, P logical ranks on streams of it (device-to-device copies in place of NCCL):
    python3 scripts/ring_bench.py --local 4 --check --seqlens-per-gpu 4096,16384

--check: every ordering, causal or not, forward and gradients against attention on the gathered
tensors by the 2x / 3x rule (baselines: naive bf16 attention and FlashLab's own kernel on the
whole sequence on one GPU); exit status 1 on a failure.

The timing (bf16, head dim 128, --heads query heads, medians of CUDA-event timings after warm-up,
ranks aligned by a barrier before each repeat), per sequence length per GPU n and mask:
    ring       the ring's forward (and with --backward its forward + backward);
    compute    the same steps with no transfer (every rank computes on blocks of its own size);
    link       the transfers alone (P - 1 send/receive rounds of K, V);
    hidden     the share of link time the overlap hid: (compute + link - ring) / link, within [0, 1];
    single     one GPU on the whole sequence (P n tokens), measured up to --single-max tokens, beyond
               that scaled from the largest measured by the square of the length (marked "~");
    efficiency single / (P x ring): the weak-scaling efficiency against one GPU;
    ring-flash-attn  the same inputs through ring-flash-attn's (zig-zag) ring where it imports.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

import torch
import torch.distributed as dist

from flashlab import distributed, ops
from flashlab._torch_reference import materialized_attention

def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local", type=int, default=0, help="P logical ranks on one GPU (0: torchrun ranks)")
    parser.add_argument("--check", action="store_true", help="correctness first (exit 1 on a failure)")
    parser.add_argument("--check-only", action="store_true", help="correctness only")
    parser.add_argument("--seqlens-per-gpu", default="8192,16384,32768,65536,131072")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--heads-kv", type=int, default=0, help="0: --heads")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--masks", default="none,causal")
    parser.add_argument("--backward", action="store_true", help="time forward + backward too")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--single-max", type=int, default=262144, help="longest sequence timed on one GPU")
    parser.add_argument("--json", default="")
    parser.add_argument("--markdown", default="")
    arguments = parser.parse_args()
    for name in ("local", "heads", "head_dim", "repeats", "single_max"):
        if getattr(arguments, name) < (0 if name == "local" else 1):
            parser.error(f"--{name.replace('_', '-')} = {getattr(arguments, name)}; allowed: >= {0 if name == 'local' else 1}")
    try:
        arguments.seqlens = [int(x) for x in arguments.seqlens_per_gpu.split(",") if x]
    except ValueError:
        parser.error(f"--seqlens-per-gpu = {arguments.seqlens_per_gpu!r}; allowed: comma-separated even integers")
    if not arguments.seqlens or any(n < 2 or n % 2 for n in arguments.seqlens):
        parser.error(f"--seqlens-per-gpu = {arguments.seqlens_per_gpu!r}; allowed: comma-separated even integers >= 2")
    arguments.mask_list = [m for m in arguments.masks.split(",") if m]
    if not arguments.mask_list or any(m not in ("none", "causal") for m in arguments.mask_list):
        parser.error(f"--masks = {arguments.masks!r}; allowed: none, causal (comma-separated)")
    return arguments


# ---------------------------------------------------------------------------------------------
# Ranks: torchrun's processes, or P logical ranks in this one

class Ranks:
    def __init__(self, local):
        self.local = local
        if local:
            self.world_size, self.rank = local, 0
            self.device = torch.device("cuda", 0)
        else:
            dist.init_process_group("nccl")
            self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", self.rank)))
        torch.cuda.set_device(self.device)

    @property
    def leader(self):
        return self.rank == 0

    def barrier(self):
        if not self.local:
            dist.barrier()
        torch.cuda.synchronize()

    def shards(self, whole, ordering):
        parts = distributed.shard_sequence(whole, self.world_size, ordering)
        return parts if self.local else parts[self.rank]

    def ring(self, q, k, v, causal, ordering):
        if self.local:
            return distributed.local_ring_attention(q, k, v, causal=causal, ordering=ordering)
        return distributed.ring_attention(q, k, v, causal=causal, ordering=ordering)

    def gathered(self, part, ordering):
        if self.local:
            return distributed.gather_sequence(part, ordering)
        pieces = [torch.empty_like(part) for _ in range(self.world_size)]
        dist.all_gather(pieces, part.contiguous())
        return distributed.gather_sequence(pieces, ordering)

    def all_ok(self, ok):
        if self.local:
            return ok
        flag = torch.tensor([1 if ok else 0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())


def timed(ranks, fn, repeats):
    """Median milliseconds of fn() over repeats, after one warm-up, ranks aligned before each."""
    fn()
    times = []
    for _ in range(repeats):
        ranks.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    value = torch.tensor([statistics.median(times)], device=ranks.device)
    if not ranks.local:  # the slowest rank's
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item()


# ---------------------------------------------------------------------------------------------
# Correctness


def with_gradients(fn, inputs, d_out):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(d_out.to(out.dtype))
    return out.detach(), [t.grad for t in leaves]


def check(ranks, arguments):
    """Every ordering, causal or not: the ring's O, dQ, dK, dV against fp32 attention on the
    gathered tensors, within 2x (3x) the error of naive bf16 attention and of one GPU's kernel."""
    n, heads, heads_kv, d = 2048, 8, 2, arguments.head_dim
    ok_all = True
    lines = []
    for ordering in distributed.ORDERINGS:
        for causal in (False, True):
            generator = torch.Generator(device=ranks.device).manual_seed(1234 + causal)
            length = n * ranks.world_size
            make = lambda h: torch.randn(1, length, h, d, device=ranks.device, dtype=torch.bfloat16, generator=generator)  # noqa: E731
            q, k, v, d_out = make(heads), make(heads_kv), make(heads_kv), make(heads)
            reference, reference_grads = with_gradients(lambda a, b, c: materialized_attention(a, b, c, causal, torch.float32),
                                                        (q, k, v), d_out.float())
            naive, naive_grads = with_gradients(lambda a, b, c: materialized_attention(a, b, c, causal, torch.bfloat16),
                                                (q, k, v), d_out)
            single, single_grads = with_gradients(lambda a, b, c: ops.flash_attn_func(a, b, c, causal=causal), (q, k, v), d_out)
            if ranks.local:
                mine = [[s.clone().requires_grad_() for s in ranks.shards(t, ordering)] for t in (q, k, v)]
                outs = ranks.ring(*mine, causal, ordering)
                torch.autograd.backward(outs, ranks.shards(d_out, ordering))
                out = ranks.gathered([o.detach() for o in outs], ordering)
                grads = [ranks.gathered([p.grad for p in parts], ordering) for parts in mine]
            else:
                mine = [ranks.shards(t, ordering).clone().requires_grad_() for t in (q, k, v)]
                part = ranks.ring(*mine, causal, ordering)
                part.backward(ranks.shards(d_out, ordering))
                out = ranks.gathered(part.detach(), ordering)
                grads = [ranks.gathered(p.grad, ordering) for p in mine]

            def error(x, y):
                return (x.float() - y.float()).abs().max().item()

            slack = 1e-5 + 2 * error(reference.to(torch.bfloat16), reference)
            ok = error(out, reference) <= 2 * error(naive, reference) + slack and \
                error(out, reference) <= 2 * error(single, reference) + slack
            detail = [f"O {error(out, reference):.2e} (naive {error(naive, reference):.2e}, one GPU {error(single, reference):.2e})"]
            for name, got, base, flash, want in zip("QKV", grads, naive_grads, single_grads, reference_grads):
                ok = ok and error(got, want) <= 3 * error(base, want) + 1e-4 and error(got, want) <= 3 * error(flash, want) + 1e-4
                detail.append(f"d{name} {error(got, want):.2e} ({error(base, want):.2e}, {error(flash, want):.2e})")
            ok = ranks.all_ok(ok)
            ok_all = ok_all and ok
            lines.append(f"{'PASS' if ok else 'FAIL'}  P {ranks.world_size} {ordering:10s} {'causal' if causal else 'none  '}  "
                         + "; ".join(detail))
    if ranks.leader:
        print(f"correctness against attention on the gathered tensors (local attention: "
              f"{distributed.local_attention_generation(ranks.device)}; 2x rule for O, 3x for gradients):")
        print("\n".join(lines))
    return ok_all


# ---------------------------------------------------------------------------------------------
# Timing

def versions(ranks):
    info = {"gpu": torch.cuda.get_device_name(ranks.device), "gpus": ranks.world_size, "local_ranks": bool(ranks.local),
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv), "local_attention": distributed.local_attention_generation(ranks.device)}
    try:
        info["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception:  # a torch without NCCL
        info["nccl"] = None
    try:
        info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True, check=True).stdout.split("\n")[0].strip()
    except (OSError, subprocess.CalledProcessError):
        info["driver"] = None
    try:
        import ring_flash_attn
        info["ring_flash_attn"] = getattr(ring_flash_attn, "__version__", "installed")
    except ImportError as error:
        info["ring_flash_attn"] = None
        info["ring_flash_attn_missing"] = str(error)
    return info


class _NoTransfer:
    """The ring's steps with every block a rank's own (the same sizes): the compute alone."""

    def __init__(self, world_size):
        self.world_size = world_size

    def send_recv(self, rank, tag, tensors):
        return distributed._NcclPending([], tuple(tensors))


def compute_alone(ranks, q, k, v, causal, ordering, backward):
    ring = distributed._make_ring(q if not ranks.local else q[0], ranks.world_size, ordering, causal, None, "auto")
    comm = _NoTransfer(ranks.world_size)
    ranks_here = range(ranks.world_size) if ranks.local else [ranks.rank]
    for r in ranks_here:
        qr, kr, vr = (t[r] for t in (q, k, v)) if ranks.local else (q, k, v)
        result = []
        distributed._drain(distributed._forward_steps(ring, r, comm, qr, kr, vr, result))
        if backward:
            grads = []
            distributed._drain(distributed._backward_steps(ring, r, comm, torch.ones_like(result[0]), qr, kr, vr,
                                                           result[0], result[1], grads))


def link_alone(ranks, k, v):
    if ranks.local:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for _ in range(ranks.world_size - 1):
                [t.clone() for parts in (k, v) for t in parts]
        torch.cuda.current_stream().wait_stream(stream)
        return
    comm = distributed._NcclRing(None)
    kv = (k, v)
    for step in range(ranks.world_size - 1):
        kv = comm.send_recv(ranks.rank, step, kv).wait()


def ring_flash_attn_call(causal):
    try:
        from ring_flash_attn import ring_flash_attn_func, zigzag_ring_flash_attn_func
    except ImportError:
        return None
    return (lambda q, k, v: zigzag_ring_flash_attn_func(q, k, v, causal=True)) if causal else \
        (lambda q, k, v: ring_flash_attn_func(q, k, v, causal=False))


def bench(ranks, arguments):
    rows = []
    heads_kv = arguments.heads_kv or arguments.heads
    single_measured = {}
    for causal in [m == "causal" for m in arguments.mask_list]:
        ordering = "zigzag"
        for n in arguments.seqlens:
            length = n * ranks.world_size
            generator = torch.Generator(device=ranks.device).manual_seed(n)
            whole = lambda h: torch.randn(1, length, h, arguments.head_dim, device=ranks.device, dtype=torch.bfloat16,  # noqa: E731
                                          generator=generator)
            q, k, v = ranks.shards(whole(arguments.heads), ordering), ranks.shards(whole(heads_kv), ordering), \
                ranks.shards(whole(heads_kv), ordering)
            passes = [("forward", False)] + ([("forward+backward", True)] if arguments.backward else [])
            for name, backward in passes:
                def ring_call():
                    if backward:
                        leaves = [[t.detach().requires_grad_() for t in part] for part in (q, k, v)] if ranks.local else \
                            [t.detach().requires_grad_() for t in (q, k, v)]
                        out = ranks.ring(*leaves, causal, ordering)
                        torch.autograd.backward(out if ranks.local else [out],
                                                [torch.ones_like(o) for o in out] if ranks.local else [torch.ones_like(out)])
                    else:
                        ranks.ring(q, k, v, causal, ordering)
                row = {"seqlen_per_gpu": n, "seqlen": length, "causal": causal, "pass": name, "ordering": ordering}
                row["ring_ms"] = timed(ranks, ring_call, arguments.repeats)
                row["compute_ms"] = timed(ranks, lambda: compute_alone(ranks, q, k, v, causal, ordering, backward),
                                          arguments.repeats)
                row["link_ms"] = timed(ranks, lambda: link_alone(ranks, k, v), arguments.repeats)
                exposed = row["compute_ms"] + row["link_ms"] - row["ring_ms"]
                row["hidden_link_share"] = min(1.0, max(0.0, exposed / row["link_ms"])) if row["link_ms"] > 0 else 1.0
                if not ranks.local:
                    key = (causal, name)
                    if length <= arguments.single_max:
                        whole_q, whole_k, whole_v = whole(arguments.heads), whole(heads_kv), whole(heads_kv)

                        def single_call():
                            if backward:
                                leaves = [t.requires_grad_() for t in (whole_q.clone(), whole_k.clone(), whole_v.clone())]
                                out = ops.flash_attn_func(*leaves, causal=causal)
                                out.backward(torch.ones_like(out))
                            else:
                                ops.flash_attn_func(whole_q, whole_k, whole_v, causal=causal)
                        row["single_ms"] = timed(ranks, single_call, max(3, arguments.repeats // 3))
                        row["single_extrapolated"] = False
                        single_measured[key] = (length, row["single_ms"])
                    elif key in single_measured:
                        measured_length, measured = single_measured[key]
                        row["single_ms"] = measured * (length / measured_length) ** 2
                        row["single_extrapolated"] = True
                    if "single_ms" in row:
                        row["efficiency"] = row["single_ms"] / (ranks.world_size * row["ring_ms"])
                    theirs = ring_flash_attn_call(causal)
                    if theirs is not None and not backward:
                        row["ring_flash_attn_ms"] = timed(ranks, lambda: theirs(q, k, v), arguments.repeats)
                        row["speedup_over_ring_flash_attn"] = row["ring_flash_attn_ms"] / row["ring_ms"]
                rows.append(row)
                if ranks.leader:
                    print(f"  P {ranks.world_size} n {n} {'causal' if causal else 'none'} {name}: ring {row['ring_ms']:.3f} ms, "
                          f"hidden {100 * row['hidden_link_share']:.0f} %", flush=True)
    return rows


def table(rows, info):
    header = ("| P | n per GPU | mask | pass | ring ms | compute ms | link ms | hidden | one GPU ms | efficiency | "
              "ring-flash-attn ms | ours faster by |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [f"{info['gpus']} x {info['gpu']} ({'logical ranks on one GPU' if info['local_ranks'] else 'NCCL'}), "
             f"local attention {info['local_attention']}, torch {info['torch']}, CUDA {info['cuda']}, NCCL {info['nccl']}, "
             f"ring-flash-attn {info['ring_flash_attn']}", "", header]
    for r in rows:
        single = (("~" if r.get("single_extrapolated") else "") + f"{r['single_ms']:.2f}") if "single_ms" in r else "-"
        lines.append(f"| {info['gpus']} | {r['seqlen_per_gpu']} | {'causal' if r['causal'] else 'none'} | {r['pass']} | "
                     f"{r['ring_ms']:.3f} | {r['compute_ms']:.3f} | {r['link_ms']:.3f} | {100 * r['hidden_link_share']:.0f} % | "
                     f"{single} | {100 * r['efficiency']:.1f} % |" if "efficiency" in r else
                     f"| {info['gpus']} | {r['seqlen_per_gpu']} | {'causal' if r['causal'] else 'none'} | {r['pass']} | "
                     f"{r['ring_ms']:.3f} | {r['compute_ms']:.3f} | {r['link_ms']:.3f} | {100 * r['hidden_link_share']:.0f} % | "
                     f"{single} | - |")
        lines[-1] += (f" {r['ring_flash_attn_ms']:.3f} | {r['speedup_over_ring_flash_attn']:.2f}x |"
                      if "ring_flash_attn_ms" in r else " - | - |")
    return "\n".join(lines)


def main():
    arguments = parse_arguments()
    if not torch.cuda.is_available():
        print("ring_bench: no CUDA device; allowed: a machine with one GPU (--local P) or several (torchrun)", file=sys.stderr)
        return 2
    ranks = Ranks(arguments.local)
    status = 0
    if arguments.check or arguments.check_only:
        status = 0 if check(ranks, arguments) else 1
    if not arguments.check_only:
        info = versions(ranks)
        rows = bench(ranks, arguments)
        if ranks.leader:
            text = table(rows, info)
            print(text)
            if arguments.json:
                with open(arguments.json, "w") as f:
                    json.dump({"format": "flashlab-ring-bench", "version": 1, "info": info, "rows": rows}, f, indent=1)
            if arguments.markdown:
                with open(arguments.markdown, "w") as f:
                    f.write(text + "\n")
    if not ranks.local:
        dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
