#!/usr/bin/env python3
"""scripts/seqlen_fit.py without a GPU: on rows whose times were made from a chosen constant and
rate (the TFLOP/s worked back by the FLOP convention), it gives back those constants and rates, their
difference and ratio, and leaves out a group of two seqlens; --min-seqlen leaves out the rows
below it (a short row off the line bends the fit without it, not with it); it refuses bad input with exit 2 and one
line on stderr, writing nothing."""
import json
import pathlib
import sys
import tempfile

from script_checks import expect_refusals, run_script

CONVENTION = "fwd 4*b*h*s^2*d (halved when causal), bwd 2.5x fwd; median of CUDA-event timings"


def tflops(batch, heads, seqlen, head_dim, causal, microseconds):
    flops = 2.5 * 4.0 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    return flops / (microseconds * 1e-6) / 1e12


# The lines the d 64 rows are made from, (constant us, us per 1024 of seqlen) by mask and
# implementation, and the table rows that give them back.
LINES = {False: {"fa3": (100, 50), "fa4": (80, 60)}, True: {"fa3": (30, 20), "fa4": (40, 25)}}
MADE_ROWS = ("| 64 | no | 1k / 2k / 4k | 100 | 80 | +20 | 50.0 | 60.0 | 0.833 | 0.0 %, 0.0 % |",
             "| 64 | yes | 1k / 2k / 4k | 30 | 40 | -10 | 20.0 | 25.0 | 0.800 | 0.0 %, 0.0 % |")


def line_rows(seqlen, above_us=0.0):
    """The d 64 rows of one seqlen at 4096 tokens, both masks, each time `above_us` above its line."""
    batch = 4096 // seqlen
    return [{"head_dim": 64, "causal": causal, "seqlen": seqlen, "batch": batch, "heads": 2,
             "bwd": {name: tflops(batch, 2, seqlen, 64, causal, c + r * seqlen / 1024 + above_us)
                     for name, (c, r) in LINES[causal].items()}}
            for causal in (False, True)]


def rows():
    """d 64 at 1k, 2k and 4k on LINES (ours 100 us + 50 us per 1024 of seqlen, the anchor 80 + 60;
    causal: ours 30 + 20, the anchor 40 + 25); d 128 at two seqlens only (left out)."""
    made = [row for seqlen in (1024, 2048, 4096) for row in line_rows(seqlen)]
    for seqlen in (1024, 2048):
        made.append({"head_dim": 128, "causal": False, "seqlen": seqlen, "batch": 4096 // seqlen, "heads": 1,
                     "bwd": {"fa3": 100.0, "fa4": 100.0}})
    return made


def main():
    failures = []
    with tempfile.TemporaryDirectory() as folder:
        work = pathlib.Path(folder)
        bench = work / "bench.json"
        bench.write_text(json.dumps({"convention": CONVENTION, "rows": rows()}))
        out = work / "out"
        out.mkdir()
        result = run_script("seqlen_fit.py", str(bench), "--json", str(out / "fit.json"), "--markdown", str(out / "fit.md"))
        if result.returncode != 0:
            failures.append(f"the fit: exit {result.returncode}, stderr {result.stderr!r}")
        else:
            fits = json.loads((out / "fit.json").read_text())["fits"]
            if [(f["head_dim"], f["causal"]) for f in fits] != [(64, False), (64, True)]:
                failures.append(f"groups fitted: {[(f['head_dim'], f['causal']) for f in fits]}, wanted d 64 both masks only")
            for f in fits:
                for name in ("fa3", "fa4"):
                    constant, rate = LINES[f["causal"]][name]
                    got = f[name]
                    if abs(got["constant_us"] - constant) > 1e-6 or abs(got["us_per_1k_seqlen"] - rate) > 1e-6 \
                            or got["largest_residual"] > 1e-9:
                        failures.append(f"causal {f['causal']} {name}: got {got}, wanted constant {constant}, rate {rate}")
            table = (out / "fit.md").read_text()
            for wanted_row in MADE_ROWS:
                if wanted_row not in table or wanted_row not in result.stdout:
                    failures.append(f"table row {wanted_row!r} missing from:\n{table}")

        # A 256-token row 40 us above each line: it bends every fit, unless --min-seqlen leaves it out.
        bent = rows() + line_rows(256, above_us=40)
        bent_file = work / "bent.json"
        bent_file.write_text(json.dumps({"convention": CONVENTION, "rows": bent}))
        for arguments, exact in (([], False), (["--min-seqlen", "1024"], True)):
            result = run_script("seqlen_fit.py", str(bent_file), *arguments)
            made_rows_fit = all(made_row in result.stdout for made_row in MADE_ROWS)
            if result.returncode != 0 or made_rows_fit != exact or ("256 / 1k" in result.stdout) == exact:
                failures.append(f"the fit with a short row off the line, {arguments or 'every seqlen'}: "
                                f"exit {result.returncode}, output:\n{result.stdout}{result.stderr}")

        bad_convention = work / "other.json"
        bad_convention.write_text(json.dumps({"convention": "fwd 2*b*h*s^2*d", "rows": rows()}))
        not_json = work / "text.json"
        not_json.write_text("rows")
        two_seqlens = work / "two.json"
        two_seqlens.write_text(json.dumps({"convention": CONVENTION, "rows": rows()[:4]}))
        cases = [
            ([str(bench), "--pass", "both"], "--pass both: give fwd or bwd"),
            ([str(bench), "--ours", "fa4"], "--ours and --anchor are both fa4"),
            ([str(bench), "--anchor", "cudnn"], "--ours/--anchor cudnn: no bwd time of that name"),
            ([str(bench), "--pass", "fwd"], "--ours/--anchor fa3: no fwd time of that name"),
            ([str(work / "missing.json")], "missing.json: cannot read it"),
            ([str(not_json)], "text.json: not a bench_kernels.py JSON"),
            ([str(bad_convention)], "other.json: FLOP convention 'fwd 2*b*h*s^2*d'"),
            ([str(two_seqlens)], "two.json: no head dim and mask with 3 seqlens"),
            ([str(bench), "--min-seqlen", "0"], "--min-seqlen 0 is outside [1, 1048576]"),
            ([str(bench), "--min-seqlen", "2048"], "bench.json: no head dim and mask with 3 seqlens from 2048"),
            ([str(bench), "--json", str(work / "no" / "fit.json")], "--json"),
            ([str(bench), "--markdown", str(work / "no" / "fit.md")], "--markdown"),
        ]
        expect_refusals("seqlen_fit.py", [], cases, work, kept=set(work.iterdir()))
        if len(list(out.iterdir())) != 2:
            failures.append(f"a refused call wrote a file: {sorted(p.name for p in out.iterdir())}")
    if failures:
        print("\n".join(f"FAILED: {f}" for f in failures))
        sys.exit(1)
    print(f"seqlen_fit.py: two fits as made, a two-seqlen group left out, a short row left out by --min-seqlen, "
          f"{len(cases)} refusals")


if __name__ == "__main__":
    main()
