#!/usr/bin/env python3
"""Benchmark FlashLab's attention kernels against PyTorch SDPA's flash, cuDNN and
memory-efficient backends and FlashAttention-4 on the same tensors, in one run on one GPU.

Our kernels are called through the C ABI of libflashlab_kernels_c.so (kernels/include/flashlab.h)
with the flashlab package's ctypes loader (python/flashlab/_abi.py), on the very PyTorch tensors
that SDPA gets ([batch, heads, seqlen, dim], bf16; "fa3_fp16"
times our Hopper kernel on fp16 copies). FlashAttention-4 (the flash-attn-4 package, its sm90 path
on Hopper) is timed when it imports, on [batch, seqlen, heads, dim] copies of the same data.
TFLOP/s use the flash-attention convention: forward 4 * b * h * s^2 * d, halved when causal;
backward 2.5x the forward. Times are medians of CUDA-event timings (triton.testing.do_bench) after
100 ms of warm-up on the same call; every implementation of a problem is timed in each of --rounds
interleaved rounds, in an order that rotates from round to round, and the median round is
reported, so a drift of clocks touches all alike. The bf16 matmul ceiling (8192^3) is measured in
the same run.
--variant NAME=PATH adds another build of the library (a candidate change), its FA2 and FA3 timed
as fa2@NAME and fa3@NAME in the same rounds; scripts/compare_bench.py sets them beside the base.
--ablation times the FA3 forward with its steps switched on one by one (d 128, causal and not,
2k and 16k); --gemm times the Hopper rung's GEMM beside torch's bf16 matmul.

Usage (on the GPU machine, after building the kernels; the package from the build tree or installed):
  PYTHONPATH=build/device/python python3 scripts/bench_kernels.py --lib build/device/kernels/libflashlab_kernels_c.so \
      --json docs/bench/h200_bench.json --markdown docs/bench/h200_bench.md
(--lib defaults to the package's own library; without the package on PYTHONPATH the script finds
python/flashlab of this checkout, whose loader needs no compiled extension.)
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

import argument_checks
import flop_convention
import interleaved_rounds
import kernel_abi

# PyTorch and Triton are imported once the arguments are checked (load_gpu_modules; also called by
# backward_kernel_times.py, which uses this module's helpers), so a bad argument is refused on any machine.
torch = F = SDPBackend = sdpa_kernel = do_bench = None
SDPA_NAMES = ("sdpa_flash", "sdpa_cudnn", "sdpa_mem_efficient")
SDPA_BACKENDS = {}  # name -> SDPBackend, filled by load_gpu_modules

_abi = kernel_abi.load()


def load_gpu_modules():
    global torch, F, SDPBackend, sdpa_kernel, do_bench
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415
    from triton.testing import do_bench  # noqa: PLC0415

    SDPA_BACKENDS.update(zip(SDPA_NAMES, (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                                          SDPBackend.EFFICIENT_ATTENTION)))


class Flashlab:
    """Our kernels through the package's loader of the C ABI (flashlab/_abi.py, checked against
    kernels/include/flashlab.h), on PyTorch tensors in [batch, heads, seqlen, dim] (any strides,
    last dim contiguous), with outputs the caller allocated once."""

    def __init__(self, path):
        self.lib = _abi.KernelLibrary(path)
        self.has_backward = True
        self.has_fa3 = self.lib.generation_built(_abi.GENERATION_CODES["fa3"])

    @staticmethod
    def tensor(t):  # data and (batch, row, head) strides in elements of a [b, h, s, d] tensor
        return t.data_ptr(), (t.stride(0), t.stride(2), t.stride(1))

    @staticmethod
    def problem(q, k, causal):
        b, h, s, d = q.shape
        dtype = {torch.float16: "fp16", torch.bfloat16: "bf16"}[q.dtype]
        return _abi.make_problem(dtype=dtype, batch=b, heads_q=h, heads_kv=k.shape[1], seqlen_q=s, seqlen_k=k.shape[2],
                                 head_dim=d, causal=causal)

    @staticmethod
    def stream():
        return torch.cuda.current_stream().cuda_stream

    def forward(self, generation, q, k, v, o, lse, causal):
        self.lib.forward(generation, self.problem(q, k, causal), *map(self.tensor, (q, k, v, o, lse)), self.stream())

    def forward_steps(self, steps, q, k, v, o, lse, causal):
        """The FA3 forward with the ablation's steps (ping_pong, overlap, persistent), each 0 or 1."""
        self.lib.fa3_forward_steps(steps, self.problem(q, k, causal), *map(self.tensor, (q, k, v, o, lse)),
                                   self.stream())

    def gemm(self, a, b, c):
        """C = A B^T on the Hopper rung's GEMM (bf16, contiguous)."""
        m, k = a.shape
        self.lib.sm90_gemm_bf16(a.data_ptr(), b.data_ptr(), c.data_ptr(), m, b.shape[0], k, self.stream())

    def backward(self, generation, q, k, v, o, lse, do, dq, dk, dv, causal, deterministic=False):
        self.lib.backward(generation, self.problem(q, k, causal), deterministic,
                          *map(self.tensor, (q, k, v, o, lse, do, dq, dk, dv)), self.stream())


def median_ms(fn):
    # 100 ms of back-to-back calls first, so the clock has settled at this implementation's load.
    return do_bench(fn, warmup=100, rep=60, return_mode="median")


def environment(command):
    def smi(field):
        try:
            return subprocess.check_output(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                                           text=True).strip().splitlines()[0]
        except Exception as error:  # noqa: BLE001 - recorded, not fatal
            return f"unavailable ({error})"
    return {
        "gpu": torch.cuda.get_device_name(), "driver": smi("driver_version"), "cuda": torch.version.cuda,
        "pytorch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
        "sm_clock_max_mhz": smi("clocks.max.sm"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "command": command,
    }


def matmul_ceiling():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = median_ms(lambda: a @ b)
    return 2 * 8192 ** 3 / ms / 1e9


def interleaved_medians(timers, rounds, order="rotated"):
    """Each timer (a function returning milliseconds) run `rounds` times, the timers taking turns
    within each round, in the `order` of interleaved_rounds (rotated: each round starting one timer
    later than the one before; balanced: a Williams design, which varies each timer's predecessor
    as well). The H200's
    clock follows its power draw: in a fixed order, an unchanged copy of our library timed fifth
    ran 1-5 % slower than the same kernels timed first (docs/kernels.md), so no position is fixed.
    Every timer also warms up on its own load first (median_ms). Returns {name: median over the rounds} and {name: error}
    for the timers that raised."""
    names = list(timers)
    times, errors = {name: [] for name in names}, {}
    for round_index in range(rounds):
        for name in interleaved_rounds.in_order(names, round_index, order):
            if name in errors:
                continue
            try:
                times[name].append(timers[name]())
            except (RuntimeError, ValueError) as error:  # a CUDA error, or a kernel refusal (KernelRefused)
                errors[name] = str(error).splitlines()[0]
    return {name: (interleaved_rounds.median(t) if t else None) for name, t in times.items()}, errors


def sdpa_forward_timer(backend, q, k, v, causal):
    def timer():
        with sdpa_kernel(backend):
            return median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    return timer


def sdpa_backward_timer(backend, q, k, v, do, causal):
    def timer():
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            return median_ms(lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True))
    return timer


def sdpa_gradients(backend, q, k, v, do, causal):
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        return torch.autograd.grad(out, (qg, kg, vg), do)


def gradient_difference(got, reference):
    """max |got - reference| of dQ, dK, dV; NaN (an unwritten element) stays NaN."""
    return {name: (g.float() - r.float()).abs().max().item() for name, g, r in zip(("dq", "dk", "dv"), got, reference)}


def flash_attn_4():
    """FlashAttention-4's forward, or None when flash-attn-4 does not import here."""
    try:
        from flash_attn.cute import flash_attn_func  # noqa: PLC0415 - optional anchor
    except Exception as error:  # noqa: BLE001 - recorded, not fatal
        print(f"FlashAttention-4 not timed: {type(error).__name__}: {error}", flush=True)
        return None
    return flash_attn_func


def fa4_version():
    try:
        from importlib.metadata import version  # noqa: PLC0415
        return version("flash-attn-4")
    except Exception:  # noqa: BLE001
        return None


def gemm_check(lib, rounds):
    """Our Hopper GEMM beside torch's bf16 matmul, interleaved, at 8192^3 and 4096^3."""
    rows = []
    for size in (4096, 8192):
        a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        c = torch.full((size, size), float("nan"), device="cuda", dtype=torch.bfloat16)
        lib.gemm(a, b, c)
        reference = a.float() @ b.float().T
        error = ((c.float() - reference).abs().max() / reference.abs().max()).item()
        timers = {"sm90_gemm": lambda: median_ms(lambda: lib.gemm(a, b, c)),
                  "torch_matmul": lambda: median_ms(lambda: a @ b.T)}
        medians, errors = interleaved_medians(timers, rounds)
        tflops = {name: (None if ms is None else 2 * size ** 3 / ms / 1e9) for name, ms in medians.items()}
        row = {"size": size, "tflops": tflops, "max_rel_error": error, "errors": errors}
        if tflops.get("sm90_gemm") and tflops.get("torch_matmul"):
            row["ratio"] = tflops["sm90_gemm"] / tflops["torch_matmul"]
        rows.append(row)
        print(f"gemm {size}^3: ours {tflops['sm90_gemm']:.0f} TFLOP/s, torch {tflops['torch_matmul']:.0f}, "
              f"ratio {row.get('ratio', float('nan')):.3f}, max rel error {error:.2e}", flush=True)
    return rows


# The ablation: FA3's steps added one at a time (ping_pong, intra_warpgroup_overlap, persistent);
# the default of fa3_forward is (1, 1, 0).
ABLATION_STEPS = {"ws_only": (0, 0, 0), "+ping_pong": (1, 0, 0), "+intra_wg_overlap (default)": (1, 1, 0),
                  "+persistent": (1, 1, 1), "default without ping_pong": (0, 1, 0)}


def ablation(lib, args):
    rows = []
    for causal in (False, True):
        for s in (2048, 16384):
            d = 128
            b, h = max(1, args.tokens // s), args.hidden // d
            q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            o = torch.empty_like(q)
            lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                reference = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            timers, diffs = {}, {}
            for name, steps in ABLATION_STEPS.items():
                o.fill_(float("nan"))
                lib.forward_steps(steps, q, k, v, o, lse, causal)
                diffs[name] = (o.float() - reference.float()).abs().max().item()
                timers[name] = lambda steps=steps: median_ms(lambda: lib.forward_steps(steps, q, k, v, o, lse, causal))
            medians, errors = interleaved_medians(timers, args.rounds, args.order)
            flops = flop_convention.flops(b, h, s, d, causal)
            row = {"head_dim": d, "causal": causal, "seqlen": s, "batch": b, "heads": h,
                   "fwd": {n: (None if ms is None else flops / ms / 1e9) for n, ms in medians.items()},
                   "max_abs_diff_vs_sdpa_flash": diffs, "errors": errors}
            rows.append(row)
            print(f"ablation d=128 causal={int(causal)} s={s:5d}  " +
                  " ".join(f"{n}={x:.0f}" for n, x in row["fwd"].items() if x is not None), flush=True)
            del q, k, v, o, lse
    return rows


def run(args):
    torch.manual_seed(0)
    # Our library first, then the variants (--variant NAME=PATH): their FA2 is timed as "fa2@NAME".
    library = args.lib or _abi.library_path()
    if library is None:
        sys.exit("bench_kernels.py: no kernel library: give --lib, or build the package with CUDA")
    libs = {"fa2": Flashlab(library)}
    for spec in args.variant:
        name, _, path = spec.partition("=")
        libs[f"fa2@{name}"] = Flashlab(path)
    lib = libs["fa2"]
    command = " ".join([os.path.basename(sys.executable)] + sys.argv)
    result = {"environment": environment(command), "convention": f"{flop_convention.TEXT}; "
              f"median of CUDA-event timings (triton do_bench), median over {args.rounds} interleaved rounds ({args.order} order)",
              "rows": []}
    result["matmul_bf16_8192_tflops"] = matmul_ceiling()
    print(f"bf16 8192^3 matmul: {result['matmul_bf16_8192_tflops']:.0f} TFLOP/s", flush=True)
    fa4 = flash_attn_4() if not args.no_fa4 else None
    result["environment"]["flash_attn_4"] = fa4_version() if fa4 is not None else None
    if args.gemm and lib.has_fa3:
        result["gemm"] = gemm_check(lib, args.rounds)
    if args.ablation and lib.has_fa3:
        result["ablation"] = ablation(lib, args)
    for d in args.head_dims:
        for causal in (False, True):
            for s in args.seqlens:
                b, h = max(1, args.tokens // s), args.hidden // d
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                o = torch.empty_like(q)
                lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
                fwd_flops = flop_convention.flops(b, h, s, d, causal)
                row = {"head_dim": d, "causal": causal, "seqlen": s, "batch": b, "heads": h, "fwd": {}, "bwd": {}}
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    reference = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                # Ours, forward (FA2; FA1 where it applies: fp16 only, so on fp16 copies of the same data).
                timers = {}
                for name, impl in libs.items():
                    wanted = args.generations if name == "fa2" else args.variant_generations
                    generations = [("fa2", 2)] + ([("fa3", 3)] if impl.has_fa3 else [])
                    for generation_name, generation in generations:
                        if generation_name not in wanted:
                            continue
                        label = name.replace("fa2", generation_name, 1)
                        o.fill_(float("nan"))
                        impl.forward(generation, q, k, v, o, lse, causal)
                        row[f"{label}_max_abs_diff_vs_sdpa_flash"] = (o.float() - reference.float()).abs().max().item()
                        timers[label] = lambda impl=impl, generation=generation: median_ms(
                            lambda: impl.forward(generation, q, k, v, o, lse, causal))
                if lib.has_fa3 and "fa3" in args.generations and args.fp16:
                    q16, k16, v16 = q.half(), k.half(), v.half()
                    o16 = torch.full_like(q16, float("nan"))
                    lib.forward(3, q16, k16, v16, o16, lse, causal)
                    row["fa3_fp16_max_abs_diff_vs_sdpa_flash"] = (o16.float() - reference.float()).abs().max().item()
                    timers["fa3_fp16"] = lambda: median_ms(lambda: lib.forward(3, q16, k16, v16, o16, lse, causal))
                if fa4 is not None:
                    q4, k4, v4 = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # [b, s, h, d]
                    try:
                        with torch.no_grad():
                            o4 = fa4(q4, k4, v4, causal=causal)
                        o4 = o4[0] if isinstance(o4, tuple) else o4
                        row["fa4_max_abs_diff_vs_sdpa_flash"] = (o4.transpose(1, 2).float() - reference.float()).abs().max().item()

                        def fa4_timer():
                            with torch.no_grad():
                                return median_ms(lambda: fa4(q4, k4, v4, causal=causal))
                        timers["fa4"] = fa4_timer
                    except Exception as error:  # noqa: BLE001 - recorded in the row
                        row.setdefault("errors", {})["fwd fa4"] = f"{type(error).__name__}: {error}".splitlines()[0]
                if d <= 128 and s <= args.fa1_max_seqlen and "fa1" in args.generations:
                    q16, k16, v16 = q.half(), k.half(), v.half()
                    o16 = torch.empty_like(q16)
                    timers["fa1_fp16"] = lambda: median_ms(lambda: lib.forward(1, q16, k16, v16, o16, lse, causal))
                for name, backend in SDPA_BACKENDS.items():
                    if name in args.sdpa:
                        timers[name] = sdpa_forward_timer(backend, q, k, v, causal)
                if args.backward_only:  # the forward ran once above, for its check; it is not timed
                    timers = {}
                medians, errors = interleaved_medians(timers, args.rounds, args.order)
                row["fwd"] = {name: (None if ms is None else fwd_flops / ms / 1e9) for name, ms in medians.items()}
                for name, error in errors.items():
                    row.setdefault("errors", {})[f"fwd {name}"] = error
                if args.backward:
                    do = torch.randn_like(q)
                    bwd_flops = flop_convention.flops(b, h, s, d, causal, backward=True)
                    timers = {}
                    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                    lib.forward(2, q, k, v, o, lse, causal)  # O and LSE for every backward (variants too)
                    # Correct first: every backward's dQ, dK, dV against SDPA flash's on the same inputs,
                    # beside cuDNN's difference from it (the yardstick of two bf16 implementations).
                    reference_grads = sdpa_gradients(SDPBackend.FLASH_ATTENTION, q, k, v, do, causal)
                    grad_diffs = {"sdpa_cudnn": gradient_difference(
                        sdpa_gradients(SDPBackend.CUDNN_ATTENTION, q, k, v, do, causal), reference_grads)}
                    def check_then_time(label, impl, generation, deterministic=False):
                        """One run on poisoned gradients, its difference recorded; then its timer."""
                        def run_backward():
                            impl.backward(generation, q, k, v, o, lse, do, dq, dk, dv, causal, deterministic)
                        for t in (dq, dk, dv):
                            t.fill_(float("nan"))
                        run_backward()
                        grad_diffs[label] = gradient_difference((dq, dk, dv), reference_grads)
                        timers[label] = lambda: median_ms(run_backward)
                    for name, impl in libs.items():
                        wanted = args.generations if name == "fa2" else args.variant_generations
                        generations = [("fa2", 2)] + ([("fa3", 3)] if impl.has_fa3 and d <= 256 else [])
                        for generation_name, generation in generations:
                            if generation_name not in wanted:
                                continue
                            check_then_time(name.replace("fa2", generation_name, 1), impl, generation)
                            if generation == 3 and args.deterministic:  # "fa3_deterministic[@NAME]"
                                check_then_time(name.replace("fa2", "fa3_deterministic", 1), impl, 3, deterministic=True)
                    if fa4 is not None:
                        def fa4_backward_timer():
                            q4, k4, v4 = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
                            out4 = fa4(q4, k4, v4, causal=causal)
                            out4 = out4[0] if isinstance(out4, tuple) else out4
                            do4 = do.transpose(1, 2).contiguous()
                            return median_ms(lambda: torch.autograd.grad(out4, (q4, k4, v4), do4, retain_graph=True))
                        timers["fa4"] = fa4_backward_timer
                    for name, backend in SDPA_BACKENDS.items():
                        if name in args.sdpa:
                            timers[name] = sdpa_backward_timer(backend, q, k, v, do, causal)
                    row["bwd_max_abs_diff_vs_sdpa_flash"] = grad_diffs
                    del reference_grads
                    medians, errors = interleaved_medians(timers, args.rounds, args.order)
                    row["bwd"] = {name: (None if ms is None else bwd_flops / ms / 1e9) for name, ms in medians.items()}
                    for name, error in errors.items():
                        row.setdefault("errors", {})[f"bwd {name}"] = error
                result["rows"].append(row)
                fmt = lambda x: "-" if x is None else f"{x:.0f}"
                print(f"d={d:3d} causal={int(causal)} s={s:5d}  fwd " +
                      " ".join(f"{n}={fmt(x)}" for n, x in row["fwd"].items()) +
                      ("  bwd " + " ".join(f"{n}={fmt(x)}" for n, x in row["bwd"].items()) if row["bwd"] else "") +
                      "  |O-O_sdpa|max " + " ".join(f"{key.split('_max')[0]}={value:.1e}" for key, value in row.items()
                                                     if key.endswith("_max_abs_diff_vs_sdpa_flash") and key.startswith(("fa", "sdpa"))) +
                      ("  |dQ,dK,dV-sdpa|max " + " ".join(f"{n}={max(x.values(), key=lambda v: float('inf') if v != v else v):.1e}" for n, x in
                                                          row["bwd_max_abs_diff_vs_sdpa_flash"].items())
                       if "bwd_max_abs_diff_vs_sdpa_flash" in row else ""), flush=True)
                del q, k, v, o, lse
    return result


def markdown(result):
    env = result["environment"]
    fa4 = env.get("flash_attn_4")
    lines = [f"{env['gpu']}, driver {env['driver']}, CUDA {env['cuda']}, PyTorch {env['pytorch']}, cuDNN {env['cudnn']}, "
             f"FlashAttention-4 {fa4 or 'not installed'}, {env['date']}; bf16 matmul ceiling "
             f"{result['matmul_bf16_8192_tflops']:.0f} TFLOP/s. TFLOP/s, and ratios of ours to each anchor.", ""]
    fmt = lambda v: "-" if v is None else f"{v:.0f}"
    for direction in ("fwd", "bwd"):
        rows = [r for r in result["rows"] if r[direction]]
        if not rows:
            continue
        ours = "fa3" if any(r[direction].get("fa3") for r in rows) else "fa2"
        columns = [c for c in ("fa3", "fa3_deterministic", "fa3_fp16", "fa2", "fa1_fp16", "fa4", "sdpa_cudnn", "sdpa_flash",
                               "sdpa_mem_efficient")
                   if any(r[direction].get(c) for r in rows)]
        anchors = [c for c in ("sdpa_cudnn", "fa4", "sdpa_flash") if c in columns]
        ratios = [(ours, a) for a in anchors] + ([("fa2", "sdpa_flash")] if ours != "fa2" and "fa2" in columns else [])
        if "fa3_deterministic" in columns:  # the deterministic mode's cost
            ratios.append(("fa3_deterministic", "fa3"))
        lines += [f"**{direction}**", "",
                  "| d | causal | seqlen | " + " | ".join(columns) + " | " +
                  " | ".join(f"{a} / {b}" for a, b in ratios) + " |",
                  "|" + " --- |" * (3 + len(columns) + len(ratios))]
        for r in rows:
            x = r[direction]
            ratio = lambda a, b: "-" if not x.get(a) or not x.get(b) else f"{x[a] / x[b]:.2f}"
            lines.append(f"| {r['head_dim']} | {'yes' if r['causal'] else 'no'} | {r['seqlen']} | " +
                         " | ".join(fmt(x.get(c)) for c in columns) + " | " +
                         " | ".join(ratio(a, b) for a, b in ratios) + " |")
        lines.append("")
    if result.get("ablation"):
        names = list(ABLATION_STEPS)
        lines += ["**FA3 forward ablation** (d 128, bf16; TFLOP/s, and each step's gain over the row before)", "",
                  "| causal | seqlen | " + " | ".join(names) + " |", "|" + " --- |" * (2 + len(names))]
        for r in result["ablation"]:
            x = r["fwd"]
            cells = []
            for i, name in enumerate(names):
                gain = "" if i == 0 or i == len(names) - 1 or not x.get(names[i - 1]) or not x.get(name) \
                    else f" ({x[name] / x[names[i - 1]]:.2f}x)"
                cells.append(fmt(x.get(name)) + gain)
            lines.append(f"| {'yes' if r['causal'] else 'no'} | {r['seqlen']} | " + " | ".join(cells) + " |")
        lines.append("")
    if result.get("gemm"):
        lines += ["**Hopper rung GEMM** (bf16, C = A B^T)", "", "| size | ours | torch | ours / torch | max rel error |",
                  "| --- | --- | --- | --- | --- |"]
        for r in result["gemm"]:
            t = r["tflops"]
            lines.append(f"| {r['size']}^3 | {fmt(t.get('sm90_gemm'))} | {fmt(t.get('torch_matmul'))} | "
                         f"{r.get('ratio', float('nan')):.3f} | {r['max_rel_error']:.1e} |")
        lines.append("")
    return "\n".join(lines)


def check_arguments(args):
    """Every argument checked before PyTorch is imported: a bad one is refused with one line on
    stderr naming it and what is allowed, exit 2, nothing written."""
    script = "bench_kernels.py"

    def refuse(text):
        argument_checks.refuse(script, text)

    checks = [("--tokens", args.tokens, 1, 1 << 24), ("--hidden", args.hidden, 8, 1 << 16), ("--rounds", args.rounds, 1, 100),
              ("--fa1-max-seqlen", args.fa1_max_seqlen, 0, 1 << 20)]
    argument_checks.check_ranges(script, checks + [("--seqlens", s, 1, 1 << 20) for s in args.seqlens])
    argument_checks.check_choice(script, "--order", args.order, interleaved_rounds.ORDERS)
    for d in args.head_dims:
        if not (8 <= d <= 256 and d % 8 == 0 and args.hidden % d == 0):
            refuse(f"--head-dims {d}: give a multiple of 8 in [8, 256] dividing --hidden {args.hidden}")
    if args.deterministic and not args.backward:
        refuse("--deterministic times the backward's deterministic mode: give it with --backward or --backward-only")
    names = set()
    for spec in args.variant:
        name, equals, path = spec.partition("=")
        if not equals or not name or not path or "@" in name or name in names:
            refuse(f"--variant {spec}: give NAME=PATH, each NAME new and without '@'")
        if not os.path.isfile(path):
            refuse(f"--variant {spec}: no file {path}")
        names.add(name)
    if args.lib is not None and not os.path.isfile(args.lib):
        refuse(f"--lib {args.lib}: no such file")
    argument_checks.check_output_folders(script, (("--json", args.json), ("--markdown", args.markdown)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", default=None,
                        help="path to libflashlab_kernels_c.so (default: the flashlab package's own library)")
    parser.add_argument("--json", required=True)
    parser.add_argument("--markdown", required=True)
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per batch (batch = tokens / seqlen)")
    parser.add_argument("--hidden", type=int, default=2048, help="heads = hidden / head_dim")
    parser.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--fa1-max-seqlen", type=int, default=4096)
    parser.add_argument("--backward", action="store_true", help="also time the backward pass")
    parser.add_argument("--backward-only", action="store_true",
                        help="time the backward pass alone (implies --backward; the forward is still run once and checked)")
    parser.add_argument("--deterministic", action="store_true",
                        help="with --backward: also time the FA3 backward's deterministic mode")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved timing rounds per problem (the median is reported)")
    parser.add_argument("--order", default="rotated",
                        help="the rounds' order (scripts/interleaved_rounds.py): rotated, or balanced, which also "
                             "varies each implementation's predecessor (balanced over a multiple of the timers' count, "
                             "twice it if odd)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=PATH",
                        help="another build of libflashlab_kernels_c.so, its FA2 (FA3) timed as fa2@NAME (fa3@NAME)")
    parser.add_argument("--generations", nargs="+", default=["fa1", "fa2", "fa3"], choices=["fa1", "fa2", "fa3"],
                        help="which of our kernel generations to time")
    parser.add_argument("--variant-generations", nargs="+", default=["fa2", "fa3"], choices=["fa2", "fa3"],
                        help="which generations of the --variant builds to time")
    parser.add_argument("--sdpa", nargs="+", default=list(SDPA_NAMES), choices=list(SDPA_NAMES),
                        help="which SDPA backends to time")
    parser.add_argument("--fp16", action="store_true", help="also time our FA3 on fp16 copies of the inputs")
    parser.add_argument("--no-fa4", action="store_true", help="do not time FlashAttention-4 even if it imports")
    parser.add_argument("--ablation", action="store_true", help="time the FA3 forward's steps one by one (d 128)")
    parser.add_argument("--gemm", action="store_true", help="time the Hopper rung's GEMM beside torch's matmul")
    args = parser.parse_args()
    args.backward = args.backward or args.backward_only
    check_arguments(args)
    load_gpu_modules()
    result = run(args)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    table = markdown(result)
    with open(args.markdown, "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
