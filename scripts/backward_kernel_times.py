#!/usr/bin/env python3
"""Where a backward's time goes: every GPU kernel (and memset) one backward call launches, with its
time per call, for our Hopper backward, cuDNN (SDPA), SDPA flash and FlashAttention-4 on the same
tensors (bf16, [batch, heads, seqlen, dim], tokens per batch and hidden size as bench_kernels.py).

Each implementation is checked first (its dQ, dK, dV against SDPA flash's, beside cuDNN's own
difference). Then, in each of --rounds interleaved rounds (the implementations in another order
each round), each is warmed up and timed: "wall" is the median CUDA-event time of one call (triton
do_bench), and --calls calls run under torch.profiler (CUPTI's kernel and memset records), a
kernel's time being its summed duration over the calls divided by --calls. A row gives the median
over the rounds of each, so wall minus the kernels' sum is what the calls spend between kernels
(launch gaps, host work of autograd), up to the rounds' spread (the row's wall of every round is
kept in the JSON). Each round also profiles --calls calls each after an L2 flush, as do_bench times
them, and keeps the ops' places: when each starts after the flush, the gap before it, its
duration, and the span from the flush's end to the last op's end (the row's "timeline").

Usage (on the GPU machine, after building the kernels):
  python3 scripts/backward_kernel_times.py --lib build/device/kernels/libflashlab_kernels_c.so \
      --json out.json --markdown out.md [--seqlens 2048 16384] [--head-dims 64 128] [--rounds 5]
"""
import argparse
import collections
import json
import re
import sys

import argument_checks
import flop_convention
from interleaved_rounds import ORDERS, in_order, median

# PyTorch, Triton and the benchmark's helpers are imported once the arguments are checked
# (load_gpu_modules), so a bad argument is refused on any machine.
torch = F = SDPBackend = sdpa_kernel = ProfilerActivity = profile = bench_kernels = None
SCRIPT = "backward_kernel_times.py"


def load_gpu_modules():
    global torch, F, SDPBackend, sdpa_kernel, ProfilerActivity, profile, bench_kernels
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    import bench_kernels  # noqa: PLC0415

    bench_kernels.load_gpu_modules()


def short_name(name, width=72):
    """A kernel's name without its template arguments and parameter list, at most `width` characters."""
    name = re.sub(r"\(.*$", "", name)
    depth, kept = 0, []
    for character in name:
        depth += character == "<"
        if depth == 0:
            kept.append(character)
        depth -= character == ">"
    name = "".join(kept).replace("void ", "").strip()
    return name if len(name) <= width else name[: width - 3] + "..."


def device_records(call, calls, before=None):
    """The profiler's device records (full name, start us, end us, duration us) of `calls` calls of
    `call`, each after `before()` if given."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            if before is not None:
                before()
            call()
        torch.cuda.synchronize()
    return [(event.name, event.time_range.start, event.time_range.end, event.device_time) for event in prof.events()
            if event.device_type == torch.autograd.DeviceType.CUDA]


def kernel_times(call, calls):
    """{kernel name: microseconds per call} of `calls` calls of `call`, from the profiler's device records."""
    totals = collections.defaultdict(float)
    for name, _, _, duration in device_records(call, calls):
        totals[short_name(name)] += duration / calls
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


# The flush before each call of a timeline: a pass over 256 MB that evicts the L2, as triton's
# do_bench does before each timed call, by a kernel no backward launches (so its records mark where
# each call starts).
FLUSH_KERNEL = "bitwise_not"


def flushed_events(call, calls):
    """The device records (name, start us, end us) of `calls` calls of `call`, each after the flush."""
    cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    return [(FLUSH_KERNEL if FLUSH_KERNEL in name else short_name(name), start, end)
            for name, start, end, _ in device_records(call, calls, before=cache.bitwise_not_)]


def call_timelines(events):
    """Per call, the ops after its flush, each (name, start, duration) in us from the flush's end.
    `events`: device records (name, start, end), in any order; records before the first flush are
    left out."""
    calls, current, flush_end = [], None, 0.0
    for name, start, end in sorted(events, key=lambda event: event[1]):
        if FLUSH_KERNEL in name:
            if current is not None:
                calls.append(current)
            current, flush_end = [], end
        elif current is not None:
            current.append((name, start - flush_end, end - start))
    if current is not None:
        calls.append(current)
    return calls


def median_timeline(calls):
    """The calls that launch the most common sequence of ops, position by position: each op's name,
    median start, duration and gap after the op before it (the flush for the first; negative where
    it starts before the op before it ends), and the median span, from the flush's end to the last
    op's end. None if no call launched anything."""
    sequences = collections.Counter(tuple(name for name, _, _ in ops) for ops in calls if ops)
    if not sequences:
        return None
    names = sequences.most_common(1)[0][0]
    chosen = [ops for ops in calls if tuple(name for name, _, _ in ops) == names]
    timeline = []
    for i, name in enumerate(names):
        gaps = [ops[i][1] - (ops[i - 1][1] + ops[i - 1][2] if i else 0.0) for ops in chosen]
        timeline.append({"name": name, "start_us": median([ops[i][1] for ops in chosen]),
                         "duration_us": median([ops[i][2] for ops in chosen]), "gap_us": median(gaps)})
    span = median([max(start + duration for _, start, duration in ops) for ops in chosen])
    return {"span_us": span, "calls": len(chosen), "ops": timeline}


def backward_calls(lib, q, k, v, do, causal):
    """{implementation: one backward call} on the same inputs; ours after our forward's O and LSE."""
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
    lib.forward(3, q, k, v, o, lse, causal)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    calls = {}

    def ours(deterministic):
        def call():
            lib.backward(3, q, k, v, o, lse, do, dq, dk, dv, causal, deterministic)
            return dq, dk, dv
        return call
    calls["fa3"] = ours(False)
    calls["fa3_deterministic"] = ours(True)
    for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        calls[name] = lambda out=out, inputs=(qg, kg, vg): torch.autograd.grad(out, inputs, do, retain_graph=True)
    fa4 = bench_kernels.flash_attn_4()
    if fa4 is not None:
        q4, k4, v4 = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
        out4 = fa4(q4, k4, v4, causal=causal)
        out4 = out4[0] if isinstance(out4, tuple) else out4
        do4 = do.transpose(1, 2).contiguous()

        def fa4_call():
            grads = torch.autograd.grad(out4, (q4, k4, v4), do4, retain_graph=True)
            return tuple(g.transpose(1, 2) for g in grads)
        calls["fa4"] = fa4_call
    return calls


def interleaved_medians(names, rounds, measure, order="rotated"):
    """measure(name) -> (wall in us, {kernel: us per call}), for every name in each of `rounds` rounds in
    the `order` of interleaved_rounds (rotated or balanced). Returns {name: (median wall, the walls round by round, {kernel: median us})}, largest
    kernel first; a kernel missing from a round's records counts 0 there."""
    walls = {name: [] for name in names}
    kernels = {name: [] for name in names}
    for round_index in range(rounds):
        for name in in_order(names, round_index, order):
            wall, times = measure(name)
            walls[name].append(wall)
            kernels[name].append(times)
    result = {}
    for name in names:
        kernel_names = {kernel for times in kernels[name] for kernel in times}
        medians = {kernel: median([times.get(kernel, 0.0) for times in kernels[name]]) for kernel in kernel_names}
        result[name] = (median(walls[name]), walls[name], dict(sorted(medians.items(), key=lambda item: -item[1])))
    return result


def run(args):
    torch.manual_seed(0)
    lib = bench_kernels.Flashlab(args.lib)
    if not lib.has_fa3:
        sys.exit("backward_kernel_times.py: the library has no Hopper rung (fa3)")
    rows = []
    for d in args.head_dims:
        for causal in (False, True):
            for s in args.seqlens:
                b, h = max(1, args.tokens // s), args.hidden // d
                q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                calls = backward_calls(lib, q, k, v, do, causal)
                reference = [g.clone() for g in calls["sdpa_flash"]()]
                if not args.sdpa_flash:
                    del calls["sdpa_flash"]
                flops = flop_convention.flops(b, h, s, d, causal, backward=True)
                differences = {name: bench_kernels.gradient_difference(call(), reference) for name, call in calls.items()}
                timelines = {name: [] for name in calls}

                def measure(name):
                    wall = bench_kernels.median_ms(calls[name]) * 1e3
                    timelines[name].append(median_timeline(call_timelines(flushed_events(calls[name], args.calls))))
                    return wall, kernel_times(calls[name], args.calls)
                measured = interleaved_medians(list(calls), args.rounds, measure, args.order)
                for name, (wall_us, walls, kernels) in measured.items():
                    difference = differences[name]
                    row = {"head_dim": d, "causal": causal, "seqlen": s, "batch": b, "heads": h, "impl": name,
                           "wall_us": wall_us, "wall_us_rounds": walls, "tflops": flops / wall_us / 1e6,
                           "kernels_us": kernels, "kernels_sum_us": sum(kernels.values()),
                           "max_abs_diff_vs_sdpa_flash": difference, "timeline": median_round(timelines[name])}
                    rows.append(row)
                    print(f"d={d} causal={int(causal)} s={s} {name}: wall {row['wall_us']:.0f} us "
                          f"({row['tflops']:.0f} TFLOP/s), kernels {row['kernels_sum_us']:.0f} us, "
                          f"max diff {max(difference.values()):.1e}", flush=True)
                del q, k, v, do, calls, reference
    return {"environment": bench_kernels.environment(" ".join(sys.argv)), "calls_profiled": args.calls,
            "rounds": args.rounds, "order": args.order, "rows": rows}


def ops_us(timeline):
    """A timeline's time in its ops, and before and between them (the sum of its median gaps)."""
    return sum(op["duration_us"] for op in timeline["ops"]), sum(op["gap_us"] for op in timeline["ops"])


def median_round(timelines):
    """Of the rounds' timelines, the one with the median span (None if no round launched anything)."""
    kept = sorted((t for t in timelines if t is not None), key=lambda t: t["span_us"])
    return kept[len(kept) // 2] if kept else None


def summary(rows):
    """One line per implementation and shape: the wall, the largest kernel (the main one), the rest,
    and the wall and the largest kernel as multiples of ours (fa3) on the same shape."""
    ours = {(r["head_dim"], r["causal"], r["seqlen"]): r for r in rows if r["impl"] == "fa3"}
    lines = ["| d | mask | seqlen | implementation | wall | largest kernel | other kernels | wall / ours | largest / ours |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        largest = max(row["kernels_us"].values(), default=0.0)
        base = ours.get((row["head_dim"], row["causal"], row["seqlen"]))
        base_largest = max(base["kernels_us"].values(), default=0.0) if base else 0.0
        wall_ratio = f"{row['wall_us'] / base['wall_us']:.3f}" if base else "-"
        largest_ratio = f"{largest / base_largest:.3f}" if base and base_largest else "-"
        lines.append(f"| {row['head_dim']} | {'causal' if row['causal'] else 'none'} | {row['seqlen']} | {row['impl']} | "
                     f"{row['wall_us']:.1f} | {largest:.1f} | {row['kernels_sum_us'] - largest:.1f} | {wall_ratio} | {largest_ratio} |")
    return lines


def span_summary(rows):
    """One line per implementation and shape with a timeline: the span after the flush, its ops' time,
    the time before and between them (ops_us), and the span as a multiple of ours (fa3) on the same shape."""
    rows = [row for row in rows if row.get("timeline")]
    ours = {(r["head_dim"], r["causal"], r["seqlen"]): r["timeline"]["span_us"] for r in rows if r["impl"] == "fa3"}
    lines = ["| d | mask | seqlen | implementation | span | in the ops | before and between them | span / ours |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        timeline, base = row["timeline"], ours.get((row["head_dim"], row["causal"], row["seqlen"]))
        in_ops, between = ops_us(timeline)
        ratio = f"{timeline['span_us'] / base:.3f}" if base else "-"
        lines.append(f"| {row['head_dim']} | {'causal' if row['causal'] else 'none'} | {row['seqlen']} | {row['impl']} | "
                     f"{timeline['span_us']:.1f} | {in_ops:.1f} | {between:.1f} | {ratio} |")
    return lines


def rounds_text(rounds):
    return f"medians of {rounds} interleaved rounds" if rounds > 1 else "one round"


def markdown(result):
    lines = ["# Backward kernels, time per call (us)", "",
             f"bf16; {rounds_text(result['rounds'])}, each of {result['calls_profiled']} profiled calls "
             "per implementation; wall = median CUDA-event time of one call; GPU "
             + result["environment"]["gpu"], ""]
    lines += summary(result["rows"]) + [""]
    spans = span_summary(result["rows"])
    if len(spans) > 2:
        lines += ["Each call after an L2 flush under the profiler (`call_timelines`): span = from the flush's end to "
                  "the call's last op's end", ""] + spans + [""]
    for row in result["rows"]:
        lines.append(f"## d {row['head_dim']}, {'causal' if row['causal'] else 'no mask'}, seqlen {row['seqlen']}, "
                     f"batch {row['batch']} x {row['heads']} heads: {row['impl']}")
        lines += ["", f"wall {row['wall_us']:.1f} us ({row['tflops']:.0f} TFLOP/s), kernels {row['kernels_sum_us']:.1f} us, "
                  f"between them {row['wall_us'] - row['kernels_sum_us']:.1f} us", "",
                  "| kernel | us per call | share of wall |", "| --- | --- | --- |"]
        lines += [f"| `{name}` | {us:.1f} | {us / row['wall_us']:.1%} |" for name, us in row["kernels_us"].items()]
        lines.append("")
        lines += timeline_lines(row.get("timeline"))
    return "\n".join(lines)


def timeline_lines(timeline):
    """A call after the flush, op by op (median_timeline), as markdown lines."""
    if timeline is None:
        return []
    in_ops, between = ops_us(timeline)
    lines = [f"After the L2 flush (median of {timeline['calls']} calls, the round of median span): span "
             f"{timeline['span_us']:.1f} us; the ops {in_ops:.1f} us, before and between them {between:.1f} us "
             "(medians op by op, so the two need not add up to the span)", "",
             "| op | gap before | starts at | duration |", "| --- | --- | --- | --- |"]
    lines += [f"| `{op['name']}` | {op['gap_us']:.1f} | {op['start_us']:.1f} | {op['duration_us']:.1f} |"
              for op in timeline["ops"]]
    lines.append("")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", required=True, help="libflashlab_kernels_c.so")
    parser.add_argument("--json", required=True)
    parser.add_argument("--markdown", required=True)
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per batch (batch = tokens / seqlen)")
    parser.add_argument("--hidden", type=int, default=2048, help="heads = hidden / head_dim")
    parser.add_argument("--seqlens", type=int, nargs="+", default=[2048, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--calls", type=int, default=10, help="profiled calls per implementation and round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians over them)")
    parser.add_argument("--order", default="rotated",
                        help="the rounds' order (scripts/interleaved_rounds.py): rotated or balanced")
    parser.add_argument("--sdpa-flash", action="store_true", help="also list SDPA flash's kernels")
    args = parser.parse_args()
    checks = [("--tokens", args.tokens, 1, 1 << 24), ("--hidden", args.hidden, 64, 1 << 16), ("--calls", args.calls, 1, 1000),
              ("--rounds", args.rounds, 1, 100)]
    checks += [("--seqlens", s, 1, 1 << 20) for s in args.seqlens]
    argument_checks.check_ranges(SCRIPT, checks)
    argument_checks.check_choice(SCRIPT, "--order", args.order, ORDERS)
    for d in args.head_dims:
        if d not in (64, 128, 256) or args.hidden % d:
            argument_checks.refuse(SCRIPT, f"--head-dims {d}: give 64, 128 or 256, dividing --hidden {args.hidden}")
    argument_checks.check_output_folders(SCRIPT, (("--json", args.json), ("--markdown", args.markdown)))
    load_gpu_modules()
    result = run(args)
    with open(args.json, "w") as file:
        json.dump(result, file, indent=1)
    with open(args.markdown, "w") as file:
        file.write(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
